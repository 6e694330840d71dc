"""The escape suite: `warren-probe` (a static binary baked into a test image)
tries from inside a sandbox, as root and as an unprivileged user, what an
attacker would (security.md §a) and reports one JSON line per check."""

import json
import shutil
import subprocess

import pytest

from conftest import ROOT
from helpers import ImageBuilder

PROBE = ROOT / "target" / "release" / "warren-probe"


@pytest.fixture(scope="module")
def probe_image(warren, images, tmp_path_factory):
    if not PROBE.exists():
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


def run_probe(warren, sid, user):
    ex, out, err, _ = warren.exec(sid, ["/bin/warren-probe"], user=user, timeout="60s")
    assert ex is not None and ex["code"] in (0, 1), (ex, out, err)
    lines = [json.loads(l) for l in out.decode().splitlines() if l.strip()]
    return ex, lines, err


@pytest.mark.parametrize("user", ["0", "1000"])
def test_escape_suite_passes(warren, sandbox, probe_image, user):
    sid = sandbox(image=probe_image)["id"]
    ex, lines, err = run_probe(warren, sid, user)
    checks = [l for l in lines if "check" in l]
    failed = [l for l in checks if not l["pass"]]
    assert not failed, json.dumps(failed, indent=1)
    summary = lines[-1]
    assert summary.get("summary") and summary["failed"] == 0 and summary["uid"].split()[0] == user
    assert ex["code"] == 0, err
    # Every numbered family of security.md §a that the probe covers is there.
    families = {c["check"].split()[0] for c in checks}
    for fam in ("01", "02", "03", "04", "05", "06", "07", "08", "09", "13", "14", "15", "36", "37"):
        assert fam in families, fam
    assert len(checks) >= 70


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


@pytest.mark.parametrize("links", [
    {"proc": "/etc", "dev": "/var/tmp", "sys": "/root"},
    {"proc": "../../../../proc", "dev": "../../../../dev"},
])
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


def test_shm_fill_is_bounded(warren, sandbox):
    """Check 19: a /dev/shm fill stops at the tmpfs size; the daemon lives."""
    sid = sandbox(memory="256M")["id"]
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
