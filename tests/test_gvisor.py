"""The gvisor isolation class (docs/isolation.md): sandboxes on gVisor's
user-space kernel through the real runsc the test setup installs. Each test
checks one behaviour that must hold as in the container class, or the
documented difference."""

import json
import os
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from conftest import WARREN, free_port, own_daemon
from helpers import cgroup_read, crash, host_traces, restart, sandbox_host_pids, sh, sh_ok, wait_until
from test_lifecycle import freezer_state



def gvisor(sandbox, **spec):
    return sandbox(isolation="gvisor", **spec)["id"]


def test_a_gvisor_sandbox_runs_on_gvisors_kernel_and_says_so(warren, sandbox):
    info = warren.create(isolation="gvisor")
    sid = info["id"]
    try:
        assert info["spec"]["isolation"] == "gvisor"
        # gVisor's own /proc (the sentry's memory accounting) and its
        # kernel's version, not the host's.
        out = sh_ok(warren, sid, "cat /proc/sentry-meminfo | head -1; uname -r")
        assert out.split()[0] == "Alloc:" and out.split()[-1] == "4.4.0", out
        # On the host, the sandbox's kernel is the sentry: nobody, in a user
        # namespace of its own, under its own seccomp filter; so are the
        # processes that run the sandbox's code (ptrace stubs). The gofer,
        # which serves files, is root of a user namespace mapped to the
        # sandbox's own host range, as a container's root is, and what the
        # sandbox writes is that range's on the host.
        sentry = info["pid"]
        base = warren.http.get(f"/v1/sandboxes/{sid}").json()["host_id_base"]
        assert base is not None and base >= 1 << 20, base
        gofers = 0
        for pid in sandbox_host_pids(sid):
            status = Path(f"/proc/{pid}/status").read_text()
            fields = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
            assert fields["Seccomp"].strip() == "2" and fields["NoNewPrivs"].strip() == "1", fields
            assert os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user"), pid
            if "runsc-gofer" in _cmd(pid).decode(errors="replace"):
                gofers += 1
                assert fields["Uid"].split()[0] == str(base), (pid, fields["Uid"])
                assert Path(f"/proc/{pid}/uid_map").read_text().split() == ["0", str(base), "65536"]
                continue
            assert fields["Uid"].split()[0] == "65534", (pid, _cmd(pid), fields["Uid"])
        assert gofers == 1, gofers
        sh_ok(warren, sid, "echo mine > /made-inside")
        assert (warren.home / "sandboxes" / sid / "upper" / "made-inside").stat().st_uid == base
        for ns in ("mnt", "net", "ipc", "uts"):
            assert os.readlink(f"/proc/{sentry}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
        # The container class, by default, is a container on the host kernel.
        other = sandbox()["id"]
        assert sh_ok(warren, other, "test -e /proc/sentry-meminfo; echo $?") == "1\n"
        assert warren.http.get(f"/v1/sandboxes/{other}").json()["spec"]["isolation"] == "container"
    finally:
        warren.destroy(sid)


def test_exec_streams_stdin_exit_codes_and_failures(warren, sandbox):
    sid = gvisor(sandbox)
    ev, out, err, _ = warren.exec(sid, ["sh", "-c", "cat; echo to-err >&2; exit 7"], stdin="cGlwZWQK")
    assert (ev["code"], out, err) == (7, b"piped\n", b"to-err\n"), (ev, out, err)
    ev, out, err, _ = warren.exec(sid, ["/nonexistent"])
    assert ev["code"] == 127 and b"No such file" in out + err, (ev, out, err)
    # The user and working directory an exec names.
    assert sh_ok(warren, sid, "id -u; pwd", user="1000", cwd="/tmp").split() == ["1000", "/tmp"]


def test_a_timeout_kills_the_whole_process_tree(warren, sandbox):
    """No host cgroup can enter the sentry: init's own exec cgroups (in
    gVisor's kernel) and its tree walk stop what the exec started, detached
    children included (a setsid'd orphan: test_hostile.py)."""
    sid = gvisor(sandbox)
    t = time.time()
    ev, out, err, _ = warren.exec(sid, ["sh", "-c", "sleep 300 & sleep 300 & sleep 300"], timeout="1s")
    assert ev["code"] == 137 and time.time() - t < 10, (ev, time.time() - t)
    assert "sleep" not in sh_ok(warren, sid, "ps -o comm"), "the timed-out exec's children survived"


def test_an_exec_cannot_leave_inits_cgroup_or_get_the_capability_init_had(warren, sandbox):
    """init mounts gVisor's cgroupfs with CAP_SYS_ADMIN, keeps only a
    descriptor of it and gives the capability up before anything runs: an
    exec (root included) is in a cgroup of its own, holds the container
    class's capabilities and no more, and has no way to the hierarchy."""
    sid = gvisor(sandbox)
    out = sh_ok(warren, sid, "cat /proc/self/cgroup; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    lines = out.splitlines()
    assert any(l.split(":")[1:] == ["cpuacct", "/exec-" + l.split("exec-")[-1]] for l in lines if "exec-" in l), out
    caps = {l.split(":")[0]: int(l.split()[1], 16) for l in lines if l.startswith("Cap")}
    container = sh_ok(warren, sandbox()["id"], "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    assert caps == {l.split(":")[0]: int(l.split()[1], 16) for l in container.splitlines()}, (out, container)
    assert not any(c & (1 << 21) for c in caps.values()), caps  # CAP_SYS_ADMIN
    # init gave it up too; its descriptors are not reachable, nor a mount.
    ev, out, err = sh(warren, sid, "grep CapEff /proc/1/status; ls /proc/1/fd; mkdir -p /tmp/cg && mount -t cgroup -o cpuacct none /tmp/cg && echo mounted")
    assert int(out.split()[1], 16) & (1 << 21) == 0, out
    assert "mounted" not in out and ev["code"] != 0, (ev, out, err)
    assert sh_ok(warren, sid, "grep -c cgroup /proc/mounts || true").strip() == "0"


def test_files_cross_both_ways_and_host_deletes_are_seen(warren, sandbox):
    sid = gvisor(sandbox)
    put = warren.http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/up.txt"}, content=b"from-host\n")
    assert put.status_code in (200, 201, 204), put.text
    assert sh_ok(warren, sid, "cat /tmp/up.txt") == "from-host\n"
    sh_ok(warren, sid, "echo in-tmp > /tmp/g.txt; echo in-root > /g.txt")
    for path, want in (("/tmp/g.txt", b"in-tmp\n"), ("/g.txt", b"in-root\n")):
        r = warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": path})
        assert (r.status_code, r.content) == (200, want), (path, r.status_code, r.text)
    # --file-access=shared: a host-side delete is seen at once, not served
    # from the sentry's cache.
    r = warren.http.post(f"/v1/sandboxes/{sid}/paths", json={"op": "remove", "path": "/tmp/g.txt"})
    assert r.status_code == 200, r.text
    assert sh_ok(warren, sid, "test -e /tmp/g.txt; echo $?") == "1\n"


def test_limits_hold_for_the_whole_sandbox_and_an_oom_ends_it(warren):
    info = warren.create(isolation="gvisor", memory="64M", cpu="0.5")
    sid = info["id"]
    try:
        # runsc tells gVisor's kernel the limit, and writes the host cgroup.
        assert sh_ok(warren, sid, "grep MemTotal /proc/meminfo").split()[1] == "65536"
        assert int(cgroup_read(sid, "memory", "memory.limit_in_bytes")) == 64 << 20
        assert int(cgroup_read(sid, "cpu", "cpu.cfs_quota_us")) == 50_000
        # Memory past the limit (a tmpfs file lives in the sentry's memory):
        # the host's OOM killer ends the sentry, so the whole sandbox ends,
        # reported as an OOM kill (docs/isolation.md).
        warren.exec(sid, ["sh", "-c", "head -c 200m /dev/zero > /dev/shm/fill"])
        wait_until(lambda: warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] != "running", 20, what="the OOM")
        got = warren.http.get(f"/v1/sandboxes/{sid}").json()
        assert got["reason"] == "oom_killed", got
        wait_until(lambda: not sandbox_host_pids(sid), 10, what="the sandbox's processes to go")
    finally:
        warren.destroy(sid)


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the host\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_network_none_is_loopback_only_and_an_allowlist_goes_through_the_proxy(warren, sandbox):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        get = f'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 5 127.0.0.1 {port}'
        none = gvisor(sandbox)
        # Its own loopback works (up, as in a container) ...
        out = sh_ok(warren, none, "nc -l -p 7000 -e echo pong & sleep 0.3; echo | nc -w 2 127.0.0.1 7000")
        assert "pong" in out, out
        # ... and nothing of the host's is reachable.
        ev, out, err = sh(warren, none, get)
        assert "hello from the host" not in out, out
        allowed = gvisor(sandbox, network={"mode": "allowlist", "allow": [f"127.0.0.1:{port}"]})
        assert "hello from the host" in sh_ok(warren, allowed, get)
        ev, out, err = sh(warren, allowed, 'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 5 10.1.2.3 80')
        assert "HTTP" not in out, out
    finally:
        server.shutdown()


@pytest.mark.parametrize("network", ["none", "allowlist"])
def test_a_port_inside_is_reachable_through_the_port_door(warren, sandbox, network):
    """`none`: gVisor's own network stack, which init connects into and
    relays; `allowlist`: host networking in the sandbox's namespace, which
    the node connects into as for a container."""
    net = {"mode": network, "allow": ["127.0.0.1:9"] if network == "allowlist" else []}
    sid = gvisor(sandbox, network=net, cmd=["sh", "-c", "mkdir -p /www && echo inside > /www/index.html && exec httpd -f -p 8000 -h /www"])
    deadline = time.time() + 20
    while time.time() < deadline:
        r = warren.http.get(f"/v1/sandboxes/{sid}/ports/8000/index.html")
        if r.status_code == 200:
            break
        time.sleep(0.2)
    assert (r.status_code, r.text) == (200, "inside\n"), r.text
    r = warren.http.get(f"/v1/sandboxes/{sid}/ports/8001/")
    assert r.status_code == 409 and "8001" in r.text, r.text


def test_pause_resume_and_usage(warren, sandbox):
    sid = gvisor(sandbox, cmd=["sh", "-c", "i=0; while true; do i=$((i+1)); done"])
    assert warren.http.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    r, _, _, _ = warren.exec(sid, ["true"])
    assert r.status_code == 409, r.text
    assert warren.http.post(f"/v1/sandboxes/{sid}/resume").status_code == 200
    assert sh_ok(warren, sid, "echo back") == "back\n"

    def cpu_seen():
        usage = warren.http.get(f"/v1/sandboxes/{sid}").json().get("usage") or {}
        return usage.get("cpu_usage_ns", 0) > 0 and usage.get("memory_bytes", 0) > 0

    wait_until(cpu_seen, 30, 0.5, what="usage samples of the sentry's cgroup")


def test_fork_and_commit_keep_files_and_class(warren, sandbox):
    sid = gvisor(sandbox)
    sh_ok(warren, sid, "echo state > /state.txt")
    r = warren.http.post(f"/v1/sandboxes/{sid}/fork", json={"count": 1})
    assert r.status_code == 201, r.text
    child = r.json()[0]["id"]
    try:
        assert sh_ok(warren, child, "cat /state.txt") == "state\n"
        assert warren.http.get(f"/v1/sandboxes/{child}").json()["spec"]["isolation"] == "gvisor"
    finally:
        warren.destroy(child)
    warren.cli("commit", sid, "gvisor-commit:1")
    again = gvisor(sandbox, image="gvisor-commit:1")
    assert sh_ok(warren, again, "cat /state.txt") == "state\n"


def test_a_fork_with_processes_resumes_the_sources_memory_in_each_child(warren, sandbox):
    """`fork --with-processes` (docs/isolation.md): the source is saved and
    resumed, and each child resumes the same memory and processes on its own
    copy of the files, with its main process's output in its own log."""
    # The token lives only in the shell's memory; the file is rewritten
    # from it, so a child that brings the file back after it is removed
    # runs the source's process with the source's memory.
    # (Written by rename, so a read never finds a file half written.)
    loop = "t=$(cat /proc/sys/kernel/random/uuid); i=0; while true; do i=$((i+1)); " \
        "echo $t > /who.new; mv /who.new /who; echo $i > /count.new; mv /count.new /count; " \
        "echo tick $i; sleep 0.1; done"
    source = gvisor(sandbox, cmd=["sh", "-c", loop])
    wait_until(lambda: sh_ok(warren, source, "cat /count 2>/dev/null || echo 0").strip() not in ("", "0", "1"), 20,
               what="the source's loop counting")
    token = sh_ok(warren, source, "cat /who").strip()
    before = int(sh_ok(warren, source, "cat /count"))
    sh_ok(warren, source, "echo kept > /file.txt")
    r = warren.http.post(f"/v1/sandboxes/{source}/fork", json={"count": 2, "with_processes": True})
    assert r.status_code == 201, r.text
    children = [c["id"] for c in r.json()]
    try:
        layer = warren.http.get(f"/v1/sandboxes/{children[0]}").json()["spec"]["fork"]
        assert layer["processes"] is True, layer
        memory = warren.home / "forks" / f"mem-{layer['layers'][0]}"
        assert memory.is_dir() and any(memory.iterdir()), memory
        for sid in [source, *children]:
            sh_ok(warren, sid, "rm -f /who")
            wait_until(lambda: sh_ok(warren, sid, "cat /who 2>/dev/null || true").strip() == token, 20,
                       what=f"{sid}'s resumed loop writing its token again")
            assert int(sh_ok(warren, sid, "cat /count")) > before
            assert sh_ok(warren, sid, "cat /file.txt") == "kept\n"
            info = warren.http.get(f"/v1/sandboxes/{sid}").json()
            assert info["state"] == "running" and info["spec"]["isolation"] == "gvisor", info
            # The resumed main process's output reaches each one's own log.
            wait_until(lambda: b"tick" in warren.cli("logs", sid).stdout, 20, what=f"{sid}'s log")
        # Each child's files are its own from the fork on.
        sh_ok(warren, children[0], "echo mine > /mine.txt")
        for other in (source, children[1]):
            assert sh_ok(warren, other, "test -e /mine.txt; echo $?") == "1\n"
    finally:
        for child in children:
            warren.destroy(child)
    for child in children:
        assert not host_traces(warren, child), host_traces(warren, child)
    wait_until(lambda: not memory.exists(), 10, what="the memory image removed with the fork's last child")
    # What cannot be saved is refused before anything happens to it.
    container = sandbox()["id"]
    r = warren.http.post(f"/v1/sandboxes/{container}/fork", json={"count": 1, "with_processes": True})
    assert r.status_code == 400 and "only a gvisor sandbox" in r.text, r.text


def test_a_crash_of_the_daemon_keeps_the_sandbox_and_destroy_leaves_nothing(images):
    with own_daemon(images) as w:
        sid = w.create(isolation="gvisor", cmd=["sh", "-c", "while true; do echo tick; sleep 0.2; done"])["id"]
        sh_ok(w, sid, "echo kept > /kept.txt")
        crash(w)
        restart(w)
        assert sh_ok(w, sid, "cat /kept.txt") == "kept\n"
        r = w.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/kept.txt"})
        assert r.content == b"kept\n"
        assert b"tick" in w.cli("logs", sid).stdout
        assert w.destroy(sid).status_code in (200, 204)
        wait_until(lambda: not host_traces(w, sid), 10, what="nothing of the sandbox on the host")
        # runsc's own state of it went with it, and no runsc process is left
        # behind (nor a zombie of one under the daemon).
        runsc = [p for p in os.listdir("/proc") if p.isdigit() and _cmd(p).startswith(b"runsc")]
        assert not [p for p in runsc if sid.encode() in _cmd(p)], runsc
        zombies = [p for p in _children(w.proc.pid) if _state(p) == "Z"]
        assert not zombies, zombies


def _cmd(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _children(parent):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == parent:
            out.append(p)
    return out


def test_the_socket_directory_cannot_fill_the_node(warren, sandbox):
    """init's socket lives on a tmpfs of a few KiB of the sandbox's own,
    not on the node's disk, which root inside could otherwise fill."""
    sid = gvisor(sandbox)
    ev, out, err = sh(warren, sid, "dd if=/dev/zero of=/dev/.warren/fill bs=1k count=1024; ls /dev/.warren")
    assert ev["code"] != 0 and "No space left" in err, (ev, out, err)
    assert sh_ok(warren, sid, "echo still-serving") == "still-serving\n"


def test_a_warm_pool_of_gvisor_sandboxes_serves_only_gvisor_creates(warren):
    name = "gvisor-pool"
    r = warren.http.put(f"/v1/pools/{name}", json={"image": "busybox:latest", "memory": "48M", "size": 1, "isolation": "gvisor"})
    assert r.status_code == 200, r.text
    try:
        listed = lambda: [s["id"] for s in warren.http.get("/v1/sandboxes", params={"label": f"warren.pool={name}"}).json()
                          if s["state"] == "running"]
        wait_until(lambda: len(listed()) == 1, 30, what="the pool's gvisor sandbox")
        (member,) = listed()
        # A container create of the same size is not served from it ...
        other = warren.create(memory="48M")
        assert other["id"] != member and other["spec"]["isolation"] == "container"
        warren.destroy(other["id"])
        # ... a gvisor one is, and gets the claimer's settings.
        got = warren.create(memory="48M", isolation="gvisor", env={"GREETING": "claimed"})
        assert got["id"] == member, (got["id"], member)
        assert sh_ok(warren, member, "echo $GREETING; uname -r") == "claimed\n4.4.0\n"
        warren.destroy(member)
    finally:
        warren.http.delete(f"/v1/pools/{name}")


def test_a_kept_sandbox_is_frozen_its_files_readable_and_an_exec_thaws_it(warren):
    sid = warren.create(isolation="gvisor", cmd=["sh", "-c", "echo kept > /tmp/result; exit 1"],
                        reclaim="keep", keep_for="30s")["id"]
    try:
        wait_until(lambda: warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "kept", 20, what="kept")
        # The whole sandbox, sentry and gofer included, is frozen in its
        # cgroup; the file API still reads through the gofer's root.
        assert freezer_state(sid) == "FROZEN"
        r = warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/result"})
        assert (r.status_code, r.content) == (200, b"kept\n")
        assert sh_ok(warren, sid, "cat /tmp/result") == "kept\n"
    finally:
        warren.destroy(sid)


def test_threads_start_and_select_waits(warren, tmp_path_factory):
    """What glibc programs do on every start: make a thread (clone3, then
    clone when told ENOSYS) and wait in select() (pselect6, which gVisor's
    table calls pselect). Both were refused in gVisor until its profile was
    adapted (gvisor/bundle.rs); E2B's SDK tests found it."""
    from debian import debian_archive

    image = "gvisor-python:1"
    warren.cli("image", "import", str(debian_archive(tmp_path_factory.mktemp("deb"))), "--name", image, timeout=300)
    sid = warren.create(image=image, isolation="gvisor")["id"]
    try:
        script = ("import select, threading; t = threading.Thread(target=print, args=('thread',)); "
                  "t.start(); t.join(); print(select.select([], [], [], 0.01))")
        assert sh_ok(warren, sid, f'python3 -c "{script}"') == "thread\n([], [], [])\n"
    finally:
        warren.destroy(sid)
