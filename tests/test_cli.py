"""The `warren` CLI contracts (docs/api.md) and the OpenAPI document."""

import datetime
import json
import re
import subprocess

import pytest

from conftest import WARREN, free_port, own_daemon
from helpers import CGROUP_ROOT, CGROUP_V2, loop_ext4, sh_ok, uniq, wait_until


def create_cli(warren, *args):
    p = warren.cli("create", "--image", "busybox:latest", *args)
    sid = p.stdout.decode().strip()
    assert sid.startswith("sbx-") and "\n" not in sid, p.stdout
    return sid


@pytest.mark.smoke  # CLI run
def test_run_prints_output_and_exits_with_code(warren):
    p = warren.cli("run", "--image", "busybox:latest", "--rm", "--", "sh", "-c", "echo hi; exit 4", check=False)
    assert p.returncode == 4, p.stderr
    assert p.stdout == b"hi\n"
    p = warren.cli("run", "--image", "busybox:latest", "--rm", "--", "sh", "-c", "echo oops >&2", check=False)
    assert p.returncode == 0
    assert p.stdout == b"" and b"oops\n" in p.stderr


def test_exec_exit_code_and_streams(warren, sandbox):
    sid = sandbox()["id"]
    p = warren.cli("exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 7", check=False)
    assert p.returncode == 7
    assert p.stdout == b"out\n" and b"err\n" in p.stderr
    p = warren.cli("exec", sid, "--", "true")
    assert p.returncode == 0
    p = warren.cli("exec", sid, "--", "no-such-cmd", check=False)
    assert p.returncode == 127
    p = warren.cli("exec", sid, "--env", "A=1", "--env", "B=two words", "--cwd", "/etc", "--", "sh", "-c", 'echo "$A $B $(pwd)"')
    assert p.stdout == b"1 two words /etc\n"
    p = warren.cli("exec", sid, "-i", "--", "sh", "-c", "tr a-z A-Z; exit 5", input=b"shout\n", check=False)
    assert p.returncode == 5 and p.stdout == b"SHOUT\n"
    p = warren.cli("exec", sid, "--timeout", "1s", "--", "sleep", "30", check=False, timeout=20)
    assert p.returncode == 137, p.stderr
    assert b"timed out" in p.stderr
    # As `docker exec`: the command follows the id, its own flags its own.
    p = warren.cli("exec", "--env", "A=x", sid, "sh", "-c", 'echo "$A" "$0"', "-n")
    assert p.stdout == b"x -n\n"


def test_run_says_which_sandbox_it_kept(warren):
    p = warren.cli("run", "--image", "busybox:latest", "--reclaim", "keep_on_failure", "sh", "-c", "exit 3",
                   check=False)
    assert p.returncode == 3
    kept = re.search(rb"sandbox (sbx-\w+) is kept", p.stderr)
    assert kept, p.stderr
    sid = kept.group(1).decode()
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "kept"
    warren.destroy(sid)


def test_run_without_a_command_runs_the_images_own(warren, tmp_path):
    (tmp_path / "Dockerfile").write_text('FROM busybox:latest\nENTRYPOINT ["echo", "from"]\nCMD ["image"]\n')
    tag = f"{uniq('cmd')}:1"
    warren.cli("build", "-t", tag, str(tmp_path))
    assert warren.cli("run", "--rm", "--image", tag).stdout == b"from image\n"
    assert warren.cli("run", "--rm", "--image", tag, "--", "echo", "mine").stdout == b"mine\n"
    # busybox's own is /bin/sh, which ends at once without stdin.
    assert warren.cli("run", "--rm", "--image", "busybox:latest").returncode == 0
    p = warren.cli("run", "--rm", "--image", "nowhere:1", check=False)
    assert p.returncode != 0 and b"not in the store" in p.stderr, p.stderr
    warren.http.delete(f"/v1/images/{tag}")


def test_docker_habits_run_detached_create_with_a_command_and_ps_ids(warren):
    label = f"t={uniq('habits')}"
    sid = warren.cli("run", "-d", "--image", "busybox:latest", "--label", label, "sleep", "60").stdout.decode().strip()
    info = warren.http.get(f"/v1/sandboxes/{sid}").json()
    assert info["state"] == "running" and info["spec"]["cmd"] == ["sleep", "60"], info
    made = warren.cli("create", "--image", "busybox:latest", "--label", label, "--", "sh", "-c", "sleep 60").stdout.decode().strip()
    assert warren.http.get(f"/v1/sandboxes/{made}").json()["spec"]["cmd"] == ["sh", "-c", "sleep 60"]
    ids = warren.cli("ps", "-q", "--label", label).stdout.decode().split()
    assert sorted(ids) == sorted([sid, made])
    table = warren.cli("ps", "--label", label).stdout.decode().splitlines()
    assert table[0].split()[:6] == ["ID", "STATE", "IMAGE", "NODE", "CPU", "MEM"], table
    assert all(len(row.split()) >= 5 and row.split()[3] != "-" and row.split()[4].endswith("s")
               for row in table[1:]), table
    # `docker stats`: a busy sandbox's CPU and memory, one reading.
    busy = warren.cli("run", "-d", "--image", "busybox:latest", "--label", label, "--name", uniq("busy"),
                      "sh", "-c", "while :; do :; done").stdout.decode().strip()
    # Its first CPU rate needs two readings of the sampler (1 s apart).
    def rate():
        rows = warren.http.get("/v1/usage").json()["sandboxes"]
        return next((r.get("cpu_millis") for r in rows if r["id"] == busy), None) or None
    wait_until(rate, timeout=10, what="a CPU reading")
    out = warren.cli("stats", "--no-stream", busy).stdout.decode().splitlines()
    assert out[0].split()[:4] == ["ID", "NAME", "CPU", "%"], out
    row = out[1].split()
    assert row[0] == busy and float(row[2].rstrip("%")) > 10, out
    assert "MiB" in out[1] or "KiB" in out[1], out
    p = warren.cli("stats", "--no-stream", "sbx-nothere", check=False)
    assert p.returncode != 0 and b"no live sandbox" in p.stderr
    p = warren.cli("run", "-d", "--rm", "--image", "busybox:latest", "true", check=False)
    assert p.returncode == 2 and b"--rm" in p.stderr, p.stderr
    warren.cli("rm", "--label", label)


def test_a_name_is_one_live_sandboxs_and_goes_wherever_an_id_does(warren):
    name = uniq("web")
    sid = warren.cli("create", "--image", "busybox:latest", "--name", name).stdout.decode().strip()
    assert warren.cli("exec", name, "echo", "hi").stdout == b"hi\n"
    assert json.loads(warren.cli("inspect", name).stdout)["id"] == sid
    assert warren.http.get(f"/v1/sandboxes/{name}/logs").status_code == 200
    assert name in warren.cli("ps").stdout.decode()
    # Taken while it lives; a fork's children are nameless.
    r = warren.http.post("/v1/sandboxes", json={"image": "busybox:latest", "name": name})
    assert r.status_code == 409 and sid in r.json()["error"]["message"], r.text
    kids = warren.http.post(f"/v1/sandboxes/{name}/fork", json={"count": 1}).json()
    assert kids[0]["spec"].get("name") is None, kids
    warren.destroy(kids[0]["id"])
    for bad in ("sbx-x", "a b", "-a"):
        r = warren.http.post("/v1/sandboxes", json={"image": "busybox:latest", "name": bad})
        assert r.status_code == 400, (bad, r.text)
    r = warren.http.post("/v1/batches", json={"count": 2, "spec": {"image": "busybox:latest", "name": name}})
    assert r.status_code == 400, r.text
    assert warren.http.get("/v1/sandboxes/no-such-name").status_code == 404
    warren.cli("rm", name)
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "destroyed"
    # Free again once its sandbox is gone.
    again = warren.cli("run", "--rm", "--image", "busybox:latest", "--name", name, "true")
    assert again.returncode == 0


@pytest.mark.smoke  # CLI create and inspect
def test_create_flags_and_inspect(warren, sandbox):
    label = uniq("cli")
    sid = create_cli(warren, "--cpu", "0.5", "--memory", "128M", "--pids", "64", "--label", f"k={label}", "--env", "K=V")
    try:
        info = json.loads(warren.cli("inspect", sid).stdout)
        assert info["id"] == sid and info["state"] == "running"
        assert info["spec"]["image"] == "busybox:latest"
        assert info["spec"]["labels"] == {"k": label}
        assert info["spec"]["env"] == {"K": "V"}
        assert info["resources"]["cpu_millis"] == 500
        assert info["resources"]["memory"] == 128 << 20
        assert info["resources"]["pids"] == 64
        assert info["image_digest"].startswith("sha256:")
        assert info["node"]
        states = [(e["state"], e["reason"]) for e in info["events"]]
        assert ("running", "ready") in states, states
        assert "usage" in info and info["usage"]["memory_bytes"] > 0
        p = warren.cli("exec", sid, "--", "sh", "-c", "echo $K")
        assert p.stdout == b"V\n"
    finally:
        warren.destroy(sid)


def test_ps_json_lists_with_label(warren, sandbox):
    label = uniq("ps")
    sid = create_cli(warren, "--label", f"task={label}")
    other = sandbox(labels={"task": label + "-x"})["id"]
    try:
        listed = json.loads(warren.cli("ps", "--json").stdout)
        mine = [s for s in listed if s["id"] == sid]
        assert len(mine) == 1 and mine[0]["spec"]["labels"] == {"task": label}
        assert mine[0]["state"] == "running"
        assert other in {s["id"] for s in listed}
        filtered = json.loads(warren.cli("ps", "--json", "--label", f"task={label}").stdout)
        assert [s["id"] for s in filtered] == [sid]
        table = warren.cli("ps", "--label", f"task={label}").stdout.decode()
        assert sid in table and f"task={label}" in table and other not in table
        warren.cli("rm", sid)
        assert sid not in {s["id"] for s in json.loads(warren.cli("ps", "--json").stdout)}
        everything = json.loads(warren.cli("ps", "--json", "--all").stdout)
        assert [s["state"] for s in everything if s["id"] == sid] == ["destroyed"]
    finally:
        warren.destroy(sid)


def test_logs_are_readable_or_json_lines(warren):
    label = uniq("logs")
    p = warren.cli(
        "run", "--image", "busybox:latest", "--label", f"t={label}", "--",
        "sh", "-c", "echo line1; echo line2; echo err1 >&2",
    )
    assert p.stdout == b"line1\nline2\n"
    sid = warren.http.get("/v1/sandboxes", params={"label": f"t={label}", "all": "true"}).json()[0]["id"]
    # Time, stream and text, as a person reads them; an exec's output (a
    # keystroke at a time on a terminal) joined into whole lines.
    readable = warren.cli("logs", sid).stdout.decode()
    shown = [l.split(" ", 2)[1:] for l in readable.splitlines()]
    # Each stream in its order (the two pipes' order between them is the
    # order the node read them in).
    assert [s[1] for s in shown if s[0] == "stdout"] == ["line1", "line2"], readable
    assert [s[1] for s in shown if s[0] == "stderr"] == ["err1"], readable
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", readable), readable
    assert shown[-1][0] == "event" and "destroyed" in shown[-1][1], readable
    live = warren.create()
    warren.exec(live["id"], ["sh", "-c", "for c in a b c; do printf $c; sleep 0.05; done; echo"])
    out = warren.cli("logs", live["id"]).stdout.decode()
    assert re.search(r"stdout\[[^\]]+\] abc$", out, re.M), out
    warren.destroy(live["id"])
    out = warren.cli("logs", "--json", sid).stdout.decode()
    records = [json.loads(l) for l in out.splitlines() if l.strip()]
    assert records, out
    assert all(r["sandbox_id"] == sid and "time" in r and r["kind"] in ("stdout", "stderr", "event", "summary") for r in records)
    text = lambda kind: "".join(r.get("text", "") for r in records if r["kind"] == kind)
    assert text("stdout") == "line1\nline2\n"
    assert text("stderr") == "err1\n"
    events = [r for r in records if r["kind"] == "event"]
    assert events and events[-1]["state"] == "destroyed", events
    # The HTTP endpoint gives the same lines; follow ends because the sandbox is over.
    assert warren.http.get(f"/v1/sandboxes/{sid}/logs").text == out
    followed = warren.cli("logs", "--follow", "--json", sid, timeout=20).stdout.decode()
    assert followed.splitlines() == out.splitlines()
    assert warren.cli("logs", "-f", sid, timeout=20).stdout.decode() == readable


def test_openapi_document(warren):
    r = warren.http.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for p in ("/v1/sandboxes", "/v1/sandboxes/{id}", "/v1/sandboxes/{id}/exec", "/v1/sandboxes/{id}/files", "/v1/images"):
        assert p in paths, sorted(paths)
    assert "post" in paths["/v1/sandboxes"] and "get" in paths["/v1/sandboxes"]
    assert "SandboxSpec" in doc["components"]["schemas"]


def test_image_ls_table(warren):
    table = warren.cli("image", "ls").stdout.decode()
    assert table.splitlines()[0].split()[:2] == ["NAME", "DIGEST"]
    assert any(l.startswith("busybox:latest ") for l in table.splitlines())


def test_doctor_reports_the_host():
    import subprocess

    from conftest import WARREN

    p = subprocess.run([str(WARREN), "doctor", "--json"], capture_output=True, timeout=30)
    checks = {c["name"]: c for c in json.loads(p.stdout)}
    assert {"kernel", "privileges", "cgroups", "overlayfs", "seccomp", "user namespaces", "disk limits", "home file system", "accept queue", "openat2"} <= set(checks)
    for c in checks.values():
        assert c["status"] in ("ok", "degraded", "missing") and c["meaning"]
    # This test host runs every other test, so nothing it needs is missing.
    assert p.returncode == 0, checks
    assert checks["cgroups"]["status"] == "ok" and checks["seccomp"]["status"] == "ok"
    # The suite runs every sandbox in a user namespace over id-mapped layers.
    assert checks["user namespaces"]["status"] == "ok", checks["user namespaces"]
    # The test setup installs runsc: the gvisor class is offered, and a
    # probe sandbox ran on its platform.
    assert "runsc version" in checks["runsc"]["found"], checks["runsc"]
    assert checks["gvisor platform"]["status"] == "ok" and "a sandbox ran" in checks["gvisor platform"]["found"]
    text = subprocess.run([str(WARREN), "doctor"], capture_output=True, timeout=30).stdout.decode()
    assert "Warren can run sandboxes here" in text
    # Without runsc the class is not offered, which is not a failure.
    p = subprocess.run([str(WARREN), "doctor", "--json", "--runsc", "/nonexistent/runsc"], capture_output=True, timeout=30)
    checks = {c["name"]: c for c in json.loads(p.stdout)}
    assert p.returncode == 0 and "not found" in checks["runsc"]["found"] and "gvisor platform" not in checks


def test_doctor_warns_of_a_home_on_ext4_without_a_journal(tmp_path):
    """Such an ext4 searches past every recently freed inode for each new
    one: under sandbox churn that cost 15% of this machine's CPU."""
    found = {}
    for journal in (True, False):
        features = [] if journal else ["-O", "^has_journal"]
        with loop_ext4(tmp_path / f"fs-{journal}.img", "64M", features) as mnt:
            p = subprocess.run([str(WARREN), "--home", str(mnt / "home"), "doctor", "--json"],
                               capture_output=True, timeout=30)
            found[journal] = {c["name"]: c for c in json.loads(p.stdout)}["home file system"]
    assert found[True]["status"] == "ok" and "with a journal" in found[True]["found"], found
    assert found[False]["status"] == "degraded", found
    assert "without a journal" in found[False]["found"] and "tune2fs" in found[False]["meaning"], found


def test_errors_say_what_to_fix_not_http(warren, sandbox, tmp_path):
    """A CLI user gets the flag, file or command to fix, never a status
    line or a header to send."""
    env = {**warren.env(), "WARREN_TOKEN": "wrong"}
    p = subprocess.run([str(WARREN), "ps"], env=env, capture_output=True)
    err = p.stderr.decode()
    assert p.returncode != 0 and "WARREN_TOKEN" in err and "--home" in err, err
    # As a word: the daemon's URL in the message has a random port, which
    # may hold the digits 401 (it did: 127.0.0.1:40121).
    assert "Bearer" not in err and not re.search(r"\b401\b", err), err
    env = {**warren.env(), "WARREN_URL": f"http://127.0.0.1:{free_port()}"}
    p = subprocess.run([str(WARREN), "ps"], env=env, capture_output=True)
    err = p.stderr.decode()
    assert p.returncode != 0 and "warren up" in err and "WARREN_URL" in err, err
    assert "error sending request" not in err, err
    p = subprocess.run([str(WARREN), "--home", str(tmp_path), "ps"], env=warren.env(), capture_output=True)
    err = p.stderr.decode()
    assert p.returncode != 0 and str(tmp_path / "token") in err and "warren up" in err, err
    p = warren.cli("inspect", "sbx-000000000000", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0 and "warren ps" in err and not re.search(r"\b404\b", err), err
    # Another daemon on the same home says which flag separates them.
    other = subprocess.run(
        [str(WARREN), "up", "--home", str(warren.home), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        timeout=30,
    )
    err = other.stderr.decode()
    assert other.returncode != 0 and "--home" in err and "root" not in err, err


def test_ls_mkdir_mv_rm_paths(warren, sandbox):
    sid = sandbox()["id"]
    sh_ok(warren, sid, "mkdir -p /w/d && printf abc > /w/f && chmod 4755 /w/f && ln -s /etc /w/etc")
    mtime = sh_ok(warren, sid, "stat -c %Y /w/f").strip()

    # ls -l's columns: mode, uid:gid, size, modified (UTC), path, -> target.
    lines = warren.cli("ls", sid, "/w").stdout.decode().splitlines()
    rows = {l.split()[-1] if "->" not in l else l.split()[-3]: l.split() for l in lines}
    assert set(rows) == {"/w/d", "/w/f", "/w/etc"}, lines
    assert rows["/w/f"][:3] == ["-rwsr-xr-x", "0:0", "3"], lines
    assert rows["/w/d"][0] == "drwxr-xr-x" and rows["/w/etc"][0] == "lrwxrwxrwx", lines
    assert rows["/w/etc"][-2:] == ["->", "/etc"], lines
    when = datetime.datetime.fromtimestamp(int(mtime), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    assert " ".join(rows["/w/f"][3:5]) == when, (lines, when)
    # A link is shown itself; with a trailing slash, what it points to (the sandbox's /etc).
    assert warren.cli("ls", sid, "/w/etc").stdout.decode().count("\n") == 1
    assert "/w/etc/hostname" in warren.cli("ls", sid, "/w/etc/").stdout.decode()
    # A file is described; --json is the API's answer; --depth descends.
    [f] = json.loads(warren.cli("ls", sid, "/w/f", "--json").stdout)
    assert f["path"] == "/w/f" and f["kind"] == "file" and f["mode"] == 0o4755
    warren.cli("mkdir", sid, "/w/d/e/g")
    deep = [e["path"] for e in json.loads(warren.cli("ls", sid, "/w", "--depth", "3", "--json").stdout)]
    assert {"/w/d/e", "/w/d/e/g"} <= set(deep) and not [p for p in deep if p.startswith("/w/etc/")], deep

    p = warren.cli("mkdir", sid, "/w/d", check=False)
    assert p.returncode != 0 and "already exists" in p.stderr.decode(), p.stderr
    warren.cli("mv", sid, "/w/d", "/new/place/d")
    assert sh_ok(warren, sid, "ls /new/place/d") == "e\n"

    # `rm ID PATH` removes a path (a whole tree), and the sandbox stays.
    assert warren.cli("rm", sid, "/new").stdout == b""
    assert sh_ok(warren, sid, "test -e /new || echo gone") == "gone\n"
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    p = warren.cli("rm", sid, "/new", check=False)
    err = p.stderr.decode()
    assert p.returncode != 0 and "/new" in err and "no such file" in err and not re.search(r"\b404\b", err), err
    # A relative path is refused before anything is destroyed.
    for args in (["tmp/x"], ["x"]):
        p = warren.cli("rm", sid, *args, check=False)
        err = p.stderr.decode()
        assert p.returncode != 0 and f"warren rm ID /{args[0]}" in err, err
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    p = warren.cli("ls", sid, "/nope", check=False)
    assert p.returncode != 0 and "/nope: no such file" in p.stderr.decode(), p.stderr
    # The plain form still destroys.
    warren.cli("rm", sid)
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "destroyed"


def test_a_home_keeps_its_cgroup_parent_and_leaves_none_behind(images):
    """`--cgroup-parent`: a daemon's sandboxes live below a cgroup of its
    own, removed when it stops; its home remembers it, so a start told
    another is refused (it would lose the cgroups of what it takes over)."""
    with own_daemon(images) as w:
        root = CGROUP_ROOT if CGROUP_V2 else CGROUP_ROOT / "pids"
        parent = root / w.cgroup_parent
        sid = w.create()["id"]
        assert (parent / sid).is_dir()
        w.stop()
        assert not parent.exists()
        other = "warren/" + uniq("other")
        p = subprocess.run(
            [WARREN, "up", "--home", w.home, "--listen", f"127.0.0.1:{free_port()}", "--cgroup-parent", other],
            capture_output=True, text=True, timeout=60,
        )
        assert p.returncode != 0 and f"--cgroup-parent {w.cgroup_parent}" in p.stderr, p.stderr
        assert not (root / other).exists()
        p = subprocess.run([WARREN, "up", "--home", w.home, "--cgroup-parent", "../up"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "invalid cgroup parent" in p.stderr, p.stderr
        w.start()
