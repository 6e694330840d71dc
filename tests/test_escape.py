"""The escape suite: `warren-probe` (a static binary baked into a test image)
tries from inside a sandbox, as root and as an unprivileged user, what an
attacker would (security.md §a) and reports one JSON line per check."""

import glob
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, TARGET
from helpers import ImageBuilder, sandbox_host_pids, sandbox_init_host_pid, sh_ok

PROBE = TARGET / "release" / "warren-probe"


@pytest.fixture(scope="module")
def probe_image(warren, images, tmp_path_factory):
    # Always through cargo (a no-op when the probe is up to date): a probe
    # left from older sources would check the old expectations.
    subprocess.run(
        ["cargo", "rustc", "-q", "-p", "warren-probe", "--release", "--", "-C", "target-feature=+crt-static"],
        cwd=ROOT, check=True,
    )
    # Static: no program interpreter, so it runs in any image.
    assert b"/ld-linux" not in PROBE.read_bytes(), "the probe must be a static binary"
    b = ImageBuilder(images["oci"], tmp_path_factory.mktemp("probe-image"))

    def add(root):
        shutil.copy(PROBE, root / "bin" / "warren-probe")
        # A setuid-root binary in the image: must not grant anything.
        # (busybox picks its applet from argv[0], so keep the name busybox.)
        (root / "suid").mkdir()
        shutil.copy(root / "bin" / "busybox", root / "suid" / "busybox")
        (root / "suid" / "busybox").chmod(0o4755)

    b.layer(add)
    tar = b.tar(tmp_path_factory.mktemp("probe-tar") / "probe.tar")
    # The archive holds a tag per layer; the name's tag picks the newest.
    name = f"probe:{b.tag}"
    warren.cli("image", "import", str(tar), "--name", name)
    return name


def run_probe(warren, sid, user, isolation="container"):
    # The probe holds the sandbox to its class's expectations; check 00
    # verifies the class against the kernel it finds inside.
    ex, out, err, _ = warren.exec(
        sid, ["/bin/warren-probe"], user=user, timeout="60s", env={"WARREN_PROBE_ISOLATION": isolation}
    )
    assert ex is not None and ex["code"] in (0, 1), (ex, out, err)
    lines = [json.loads(l) for l in out.decode().splitlines() if l.strip()]
    return ex, lines, err


# The checks that may answer "pass": null (not applicable) in each class,
# and why. Anything else the probe marks so is a failure: the probe cannot
# silently drop a check.
NOT_APPLICABLE = {
    "container": {},
    "gvisor": {
        # gVisor's kernel shows its own identity map (0 0 4294967295): ids
        # inside are gVisor's; the host identity is the sentry's, checked
        # from the host by test_gvisor.py.
        "11 uid_map": "identity map of gVisor's own kernel",
        "11 gid_map": "identity map of gVisor's own kernel",
        # Only net, pid and user exist under gVisor's /proc/self/ns, with
        # gVisor's own inode numbers: nothing to compare with the host's.
        "39 amicontained namespaces": "gVisor's own namespaces",
    },
}


def check_probe_report(ex, lines, err, user, isolation):
    checks = [l for l in lines if "check" in l]
    failed = [l for l in checks if l["pass"] is False]
    assert not failed, json.dumps(failed, indent=1)
    assert all(l["pass"] in (True, None) for l in checks), [l for l in checks if l["pass"] not in (True, False, None)]
    na = {l["check"] for l in checks if l["pass"] is None}
    assert na == set(NOT_APPLICABLE[isolation]), (na, set(NOT_APPLICABLE[isolation]))
    assert all(l.get("reason") for l in checks if l["pass"] is None)
    summary = lines[-1]
    assert summary.get("summary") and summary["failed"] == 0 and summary["uid"].split()[0] == user
    assert summary["isolation"] == isolation and summary["not_applicable"] == len(na), summary
    assert ex["code"] == 0, err
    # Every numbered family of security.md §a that the probe covers is there.
    families = {c["check"].split()[0] for c in checks}
    for fam in ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "13", "14", "15", "36", "37", "39"):
        assert fam in families, fam
    assert len(checks) >= 70
    return checks


@pytest.mark.parametrize("user", ["0", "1000"])
@pytest.mark.parametrize("isolation", ["container", "gvisor"])
def test_escape_suite_passes(warren, sandbox, probe_image, isolation, user):
    # Network none, the default: a gVisor sandbox then runs on gVisor's
    # own network stack, its sentry nobody in a user namespace of its own.
    sid = sandbox(image=probe_image, isolation=isolation)["id"]
    ex, lines, err = run_probe(warren, sid, user, isolation)
    report = os.environ.get("WARREN_ESCAPE_REPORT")
    if report:  # scripts/escape_table.py turns these into docs/security.md's table
        Path(report, f"{isolation}-{user}.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    check_probe_report(ex, lines, err, user, isolation)


def test_escape_suite_passes_in_gvisor_with_host_networking(warren, sandbox, probe_image):
    """An allowlist sandbox in gVisor uses host networking in its own
    network namespace, and runsc then leaves the sentry and its stubs host
    root in the host's user namespace, under seccomp (a weaker second
    wall): what code inside can do must be the same. Only its /dev lacks gVisor's net/tun, and raw sockets
    answer EAFNOSUPPORT (host networking has none) where netstack's say EPERM."""
    sid = sandbox(image=probe_image, isolation="gvisor", network={"mode": "allowlist", "allow": ["127.0.0.1:9"]})["id"]
    ex, lines, err = run_probe(warren, sid, "0", "gvisor")
    checks = {c["check"]: c for c in check_probe_report(ex, lines, err, "0", "gvisor")}
    assert checks["13 /dev/net/tun"]["observed"] == "open: ENOENT", checks["13 /dev/net/tun"]


def test_setuid_binary_grants_nothing(warren, sandbox, probe_image):
    sid = sandbox(image=probe_image)["id"]
    ex, out, err, _ = warren.exec(
        sid, ["/suid/busybox", "sh", "-c", "id -u; grep CapEff /proc/self/status"], user="1000"
    )
    mode = warren.exec(sid, ["stat", "-c", "%a %u", "/suid/busybox"])[1].decode().split()
    assert mode == ["4755", "0"], mode  # the bit survived import: the test means something
    text = out.decode().split()
    assert text and text[0] == "1000" and text[-1] == "0000000000000000", (ex, out, err)


def test_sandboxes_cannot_see_each_other(warren, sandbox, probe_image):
    a = sandbox(image=probe_image)["id"]
    b = sandbox(image=probe_image)["id"]
    warren.exec(b, ["sh", "-c", "echo secret-b > /tmp/secret; sleep 1000 >/dev/null 2>&1 &"])
    ex, out, _, _ = warren.exec(a, ["sh", "-c", "ps -o args; cat /tmp/secret 2>&1; ipcs 2>&1 | wc -l"])
    text = out.decode()
    assert "sleep 1000" not in text and "secret-b" not in text


def host_ids(pid):
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    field = lambda name: [int(x) for x in next(l for l in status if l.startswith(name)).split()[1:]]
    return field("Uid:"), field("Gid:")


def test_root_inside_is_an_unprivileged_host_range_of_its_own(warren, sandbox):
    """Check 11 from the host: each sandbox's root is a different
    unprivileged host uid, what it writes is owned by that uid, what the
    API writes is the sandbox root's, and the range is given back."""
    ranges = {}
    for _ in range(2):
        sid = sandbox()["id"]
        sh_ok(warren, sid, "echo mine > /made-inside")
        warren.exec(sid, ["sh", "-c", "sleep 300 >/dev/null 2>&1 &"], user="1000")
        pid = sandbox_init_host_pid(sid)
        uids, gids = host_ids(pid)
        base = uids[0]
        assert base >= 1 << 20 and set(uids) == {base} and set(gids) == {base}, (uids, gids)
        assert Path(f"/proc/{pid}/uid_map").read_text().split() == ["0", str(base), "65536"]
        assert warren.http.get(f"/v1/sandboxes/{sid}").json()["host_id_base"] == base
        upper = warren.home / "sandboxes" / sid / "upper"
        assert (upper / "made-inside").stat().st_uid == base
        # A user inside is base + its uid on the host.
        deadline = time.time() + 5
        while True:
            users = {host_ids(p)[0][0] for p in sandbox_host_pids(sid) if Path(f"/proc/{p}").exists()}
            if base + 1000 in users or time.time() > deadline:
                break
            time.sleep(0.1)
        assert base + 1000 in users, (base, users)
        # Written by the daemon (host root), seen inside as the sandbox's root.
        warren.http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/from-api/f"}, content=b"x").raise_for_status()
        assert sh_ok(warren, sid, "stat -c '%u:%g' /from-api /from-api/f").split() == ["0:0", "0:0"]
        assert (upper / "from-api" / "f").stat().st_uid == base
        ranges[sid] = base
    a, b = sorted(ranges.values())
    assert b - a >= 65536, ranges
    # The claim on the range goes with the sandbox.
    claims = lambda: {Path(f).read_text() for f in glob.glob("/run/warren/uids/[0-9]*")}
    for sid in ranges:
        assert str(warren.home / "sandboxes" / sid) in claims()
        warren.destroy(sid)
        assert str(warren.home / "sandboxes" / sid) not in claims()


@pytest.mark.parametrize("links", [
    {"proc": "/etc", "dev": "/var/tmp", "sys": "/root"},
    {"proc": "../../../../proc", "dev": "../../../../dev"},
])
@pytest.mark.serial  # lists the host's /etc, /root, /var/tmp and /dev before and after
def test_hostile_image_with_symlinked_system_dirs(warren, images, tmp_path, links):
    """An image whose /proc, /dev or /sys are symlinks to host-looking paths
    (the runc CVE-2023-27561 / 2025-31133 / 2025-52565 class): creation is
    refused as bad input (or the mounts land inside the sandbox); the host is
    untouched."""
    import os
    import uuid

    b = ImageBuilder(images["oci"], tmp_path / "build")

    def plant(root):
        for name, target in links.items():
            d = root / name
            if d.is_symlink() or d.is_file():
                d.unlink()
            elif d.exists():
                shutil.rmtree(d)
            os.symlink(target, d)

    b.layer(plant)
    tar = b.tar(tmp_path / "hostile.tar")
    name = f"hostile-{uuid.uuid4().hex[:8]}:{b.tag}"
    warren.cli("image", "import", str(tar), "--name", name)
    watched = ["/etc", "/var/tmp", "/root", "/proc", "/dev"]
    before = {d: sorted(os.listdir(d)) for d in watched if d not in ("/proc",)}
    r = warren.http.post("/v1/sandboxes", json={"image": name})
    if r.status_code == 201:
        sid = r.json()["id"]
        ex, out, _, _ = warren.exec(sid, ["sh", "-c", "touch /proc/x /dev/x /sys/x 2>/dev/null; ls /proc | head -3"])
        assert ex["code"] == 0
        warren.destroy(sid)
    else:
        # Refused as bad input, before anything is recorded or made.
        assert r.status_code == 400, r.text
        assert "symlink" in r.json()["error"]["message"] and "rebuild the image" in r.json()["error"]["message"]
        assert not [s for s in warren.http.get("/v1/sandboxes", params={"all": "true"}).json() if s["spec"]["image"] == name]
        leftover = [p for p in (warren.home / "sandboxes").iterdir() if p.name not in
                    {s["id"] for s in warren.http.get("/v1/sandboxes").json()}]
        assert leftover == []
    after = {d: sorted(os.listdir(d)) for d in watched if d not in ("/proc",)}
    assert after == before
    assert not os.path.exists("/dev/x") and not os.path.exists("/etc/x") and not os.path.exists("/root/x")


@pytest.mark.parametrize("isolation", ["container", "gvisor"])
def test_shm_fill_is_bounded(warren, sandbox, isolation):
    """Check 19: a /dev/shm fill stops at the tmpfs size; the daemon lives.
    In gVisor /dev/shm is the sentry's own tmpfs (its memory, in the
    sandbox's cgroup), sized by the bundle as the container's is."""
    sid = sandbox(memory="256M", isolation=isolation)["id"]
    ex, out, err, _ = warren.exec(
        sid, ["sh", "-c", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=200 2>&1; ls -l /dev/shm/fill"]
    )
    text = out.decode()
    assert "No space left on device" in text, text
    size = int(text.strip().splitlines()[-1].split()[4])
    assert size <= 64 << 20, size
    assert warren.http.get("/healthz").status_code == 200


def test_inode_fill_is_bounded_by_the_disk_limit(warren, sandbox):
    """Check 20: millions of empty files stop at the sandbox's own file system."""
    sid = sandbox(disk="16M")["id"]
    ex, out, err, _ = warren.exec(
        sid,
        ["sh", "-c", "mkdir /f; i=0; while touch /f/$i 2>/dev/null; do i=$((i+1)); done; echo $i; touch /f/x"],
        timeout="120s",
    )
    lines = (out + err).decode().split("\n")
    created = int(lines[0])
    assert 100 < created < 100_000, created
    assert "No space left on device" in (out + err).decode()
    assert warren.http.get("/healthz").status_code == 200


def test_file_api_symlink_swap_race_stays_inside(warren, sandbox, tmp_path):
    """Check 17's concurrent swap (the CVE-2018-15664 class): inside the
    sandbox a loop keeps swapping a directory with symlinks to `/` and to a
    host path, while the host hammers GET/PUT /files and `warren cp` on paths
    through it. No host file may ever be read, written or created."""
    import hashlib
    import os
    import shutil
    import threading
    import time
    import uuid

    import httpx

    from helpers import make_tar, sh_ok

    name = f"warren-race-{uuid.uuid4().hex[:8]}"
    host_dir = f"/tmp/{name}"
    os.makedirs(host_dir)
    marker = os.path.join(host_dir, "marker")
    secret = b"HOST-MARKER-" + uuid.uuid4().hex.encode()
    with open(marker, "wb") as f:
        f.write(secret)
    st = os.stat(marker)

    def host_state():
        with open(marker, "rb") as f:
            return sorted(os.listdir(host_dir)), hashlib.sha256(f.read()).hexdigest()

    before = host_state()
    try:
        sid = sandbox()["id"]
        # /w/swap is in turn a real directory (holding `side` and the host
        # marker's path) and a symlink, to / or to the host directory. An
        # upload can recreate /w/swap while it is briefly missing; the loop
        # clears that and carries on.
        sh_ok(warren, sid, f"""
            mkdir -p /w/swap{host_dir} && echo real > /w/swap/side
            (n=0; while [ ! -e /w/stop ]; do
                if [ $((n % 2)) = 0 ]; then t=/; else t={host_dir}; fi
                mv -T /w/swap /w/real
                rm -rf /w/swap; ln -s $t /w/swap
                rm -f /w/swap; mv -T /w/real /w/swap
                n=$((n+1)); echo $n > /w/swaps
            done) >/dev/null 2>&1 &
        """)
        # Through the link to / these name the host marker's path; through
        # the link to the host directory, /w/swap/marker does.
        targets = [f"/w/swap{host_dir}/marker", "/w/swap/marker"]
        dirs = [f"/w/swap{host_dir}", "/w/swap", "/w/swap/tmp"]
        seen = {"real": 0, "other": 0, "cut": 0, "done": 0, "leaked": []}
        stop = time.time() + 4

        def request(c, method, path, **kw):
            # A file rewritten while it streams out can end the response
            # early (its length was announced first); that is not a leak.
            try:
                return c.request(method, f"/v1/sandboxes/{sid}/files", params={"path": path}, **kw)
            except httpx.TransportError:
                seen["cut"] += 1
                return None

        def reader():
            with warren.client() as c:
                while time.time() < stop:
                    r = request(c, "GET", "/w/swap/side")
                    if r is not None:
                        seen["real" if r.status_code == 200 else "other"] += 1
                    for path in targets + dirs:
                        r = request(c, "GET", path)
                        if r is not None and secret in r.content:
                            seen["leaked"].append(path)
            seen["done"] += 1

        def writer():
            with warren.client() as c:
                i = 0
                while time.time() < stop:
                    i += 1
                    for path in targets:
                        request(c, "PUT", path, content=b"pwned\n")
                    for d in dirs[:2]:
                        request(c, "PUT", f"{d}/new-{i}", content=b"pwned\n")
                        tar = make_tar([("marker", "file", b"pwned tar\n", 0o644), (f"tar-{i}", "file", b"x", 0o644)])
                        request(c, "PUT", d, content=tar, headers={"content-type": "application/x-tar"})
            seen["done"] += 1

        src = tmp_path / "cp-src"
        src.write_bytes(b"pwned by cp\n")
        threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
        for t in threads:
            t.start()
        cps = 0
        while time.time() < stop:
            cps += 1
            for path in targets:
                warren.cli("cp", str(src), f"{sid}:{path}", check=False)
                out = tmp_path / f"cp-out-{cps}"
                p = warren.cli("cp", f"{sid}:{path}", str(out), check=False)
                if p.returncode == 0 and out.is_file() and secret in out.read_bytes():
                    seen["leaked"].append(f"cp {path}")
            warren.cli("cp", str(src), f"{sid}:/w/swap/cp-new", check=False)
        for t in threads:
            t.join()
        swaps = int(sh_ok(warren, sid, "touch /w/stop; sleep 0.3; cat /w/swaps").strip())

        print("swap race:", {k: v for k, v in seen.items() if k != "leaked"}, "swaps", swaps, "cp rounds", cps)
        assert not seen["leaked"], seen["leaked"]
        assert host_state() == before, host_state()
        after = os.stat(marker)
        assert (after.st_mtime_ns, after.st_ino, after.st_nlink) == (st.st_mtime_ns, st.st_ino, st.st_nlink)
        # The race was real: the swapper kept going and requests landed on
        # both the real directory and the links.
        assert seen["done"] == 2, seen  # neither thread died
        assert swaps > 20, swaps
        assert cps > 3, cps
        assert seen["real"] > 0 and seen["other"] > 0, seen
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
