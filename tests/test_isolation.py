"""Isolation, checked from inside a sandbox and from the host (docs/security.md)."""

import resource
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import own_daemon
from helpers import (
    CGROUP_V2,
    cgroup_dir,
    cgroup_read,
    cgroup_stat,
    cpu_usage_ns,
    host_traces,
    sandbox_host_pids,
    sandbox_init_host_pid,
    sh,
    sh_ok,
    uniq,
)


def test_ps_sees_only_own_processes(warren, sandbox):
    sid = sandbox()["id"]
    ev, out, err, _ = warren.exec(sid, ["ps"])
    assert ev["code"] == 0, err
    rows = [l.split(None, 2) for l in out.decode().splitlines()[1:] if l.strip()]
    pids = sorted(int(r[0]) for r in rows)
    # PID 1 (Warren's init), the exec's shim (which keeps the exec's process
    # tree together) and the ps itself, nothing else.
    assert len(pids) == 3 and pids[0] == 1, out.decode()
    by_pid = {int(r[0]): r[2] for r in rows}
    assert "warren-shim" in by_pid[pids[1]] and "ps" in by_pid[pids[2]], out.decode()

    # /proc only lists the sandbox's processes too.
    listed = sh_ok(warren, sid, "ls /proc | grep -E '^[0-9]+$'").split()
    # init, the exec's shim, sh, ls and grep.
    assert "1" in listed and len(listed) <= 5, listed
    # Host processes cannot be signalled, and are not in /proc.
    daemon = warren.proc.pid
    ev, out, err = sh(warren, sid, f"kill -0 {daemon}; echo kill=$?; test -e /proc/{daemon}; echo proc=$?")
    assert "kill=0" not in out and "proc=1" in out, (out, err)
    # ... while from the host the sandbox's processes are real processes.
    assert sandbox_host_pids(sid), "no host process found in the sandbox's cgroup"


def test_root_is_a_volatile_overlay(warren, sandbox):
    """The root never syncs the host's disk: neither when the sandbox ends
    (its last process would wait for a flush of the whole host file system)
    nor when the sandbox calls sync (docs/security.md)."""
    sid = sandbox()["id"]
    root = [l for l in sh_ok(warren, sid, "cat /proc/self/mountinfo").splitlines() if l.split()[4] == "/"]
    assert len(root) == 1, root
    fields = root[0].split(" - ", 1)[1].split()
    fstype, options = fields[0], fields[2].split(",")
    # Shown as `volatile` by older kernels, `fsync=volatile` by newer ones.
    assert fstype == "overlay" and {"volatile", "fsync=volatile"} & set(options), root[0]
    assert "nosuid" in root[0].split(" - ")[0] and "nodev" in root[0].split(" - ")[0], root[0]
    # Writes still read back, and sync returns.
    assert sh_ok(warren, sid, "echo kept > /f && sync && cat /f").strip() == "kept"


@pytest.mark.skipif(CGROUP_V2, reason="cgroup v1 hierarchies")
def test_a_sandbox_has_cgroups_only_where_it_is_limited_or_counted(warren, sandbox):
    """A sandbox cpuset made every create walk all sibling cpusets and every
    destroy rebuild the scheduler domains over them (docs/configuration.md):
    the sandbox gets no cpuset, and does not see one."""
    sid = sandbox(memory="48M")["id"]
    for controller in ("memory", "pids", "freezer", "devices", "cpu"):
        assert cgroup_dir(sid, controller).is_dir(), controller
    with pytest.raises(FileNotFoundError):
        cgroup_dir(sid, "cpuset")
    inside = sh_ok(warren, sid, "ls /sys/fs/cgroup").split()
    assert {"memory", "pids", "freezer", "devices"} <= set(inside), inside
    assert "cpuset" not in inside and "systemd" not in inside, inside
    # Each hierarchy it sees is rooted at its own cgroup.
    limit = sh_ok(warren, sid, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes").strip()
    assert int(limit) == 48 << 20, limit


def test_host_files_unreachable(warren, sandbox, tmp_path):
    name = uniq("warren-host-marker")
    markers = [Path("/tmp") / name, Path("/root") / name, tmp_path / name]
    for m in markers:
        m.write_text("host secret\n")
    try:
        sid = sandbox()["id"]
        checks = "; ".join(f"test -e {m} && echo FOUND {m}" for m in markers)
        out = sh_ok(
            warren,
            sid,
            f"{checks}; find / -xdev -name '{name}*' 2>/dev/null; "
            f"cat /proc/self/root/etc/hostname; readlink /proc/self/root; "
            f"ls /proc/1/root/tmp/{name} 2>/dev/null && echo FOUND-via-proc1; true",
        )
        assert "FOUND" not in out and name not in out, out
        # The sandbox's root is the image's: its /etc/hostname, not the host's.
        assert "warren-busybox" in out.splitlines(), out
        assert Path("/etc/hostname").read_text().strip() != "warren-busybox"

        # From the host: the init's root is the sandbox rootfs, without the markers.
        init = sandbox_init_host_pid(sid)
        root = Path(f"/proc/{init}/root")
        assert (root / "etc/hostname").read_text() == "warren-busybox\n"
        assert not (root / "tmp" / name).exists()
        # A file made inside does not appear on the host.
        inner = uniq("warren-inner")
        sh_ok(warren, sid, f"echo inside > /tmp/{inner}; echo inside > /root/{inner}")
        assert not (Path("/tmp") / inner).exists() and not (Path("/root") / inner).exists()
        assert (root / "tmp" / inner).read_text() == "inside\n"
    finally:
        for m in markers:
            m.unlink(missing_ok=True)


def _host_ipv4():
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    return None


def test_network_only_loopback_and_host_unreachable(warren, sandbox):
    sid = sandbox()["id"]
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    host_ip = _host_ipv4()
    try:
        # Control: the host itself can reach the listener.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        listener.accept()[0].close()

        targets = ["127.0.0.1"] + ([host_ip] if host_ip else [])
        probes = "; ".join(
            f"nc -w 2 {t} {port} </dev/null; echo host_{i}=$?" for i, t in enumerate(targets)
        )
        script = f"""
            echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ,)"
            echo "links=$(ip -o link | cut -d: -f2 | tr -d ' ' | sort | tr '\\n' ,)"
            echo "routes=$(ip route | wc -l)"
            # Control: loopback inside the sandbox works.
            nc -ll -p 9123 -e echo pong &
            for i in $(seq 100); do r=$(nc 127.0.0.1 9123 </dev/null 2>/dev/null); [ "$r" = pong ] && break; sleep 0.05; done
            echo "loopback=$r"
            kill %1
            {probes}
        """
        out = sh_ok(warren, sid, script)
        assert "ifaces=lo," in out.splitlines(), out
        assert "links=lo," in out.splitlines(), out
        assert "routes=0" in out.splitlines(), out  # no route anywhere (lo routes live in table local)
        assert "loopback=pong" in out.splitlines(), out
        for i, _ in enumerate(targets):
            assert f"host_{i}=0" not in out and f"host_{i}=" in out, out
        # Nothing reached the host listener.
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_privileged_operations_refused(warren, sandbox):
    sid = sandbox()["id"]
    script = """
        grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\\t '
        mount -t tmpfs none /mnt; echo mount=$?
        grep -q ' /mnt ' /proc/mounts && echo MOUNTED
        unshare -n true; echo unshare_net=$?
        unshare -m true; echo unshare_mnt=$?
        head -c 4096 /dev/urandom > /tmp/evil.ko
        insmod /tmp/evil.ko; echo insmod=$?
        ip link add dummy0 type dummy; echo iplink=$?
        hostname evil; echo hostname=$?
        hostname
    """
    ev, out, err = sh(warren, sid, script)
    lines = out.splitlines()
    assert "CapEff:00000000000004fb" in lines, out
    assert "NoNewPrivs:1" in lines and "Seccomp:2" in lines, out
    for op in ("mount", "unshare_net", "unshare_mnt", "insmod", "iplink", "hostname"):
        assert f"{op}=0" not in lines and any(l.startswith(f"{op}=") for l in lines), (op, out, err)
    assert "MOUNTED" not in out
    # insmod got as far as the syscall, which was refused (not "file not found").
    assert "can't insert '/tmp/evil.ko'" in err and "No such file" not in err, err
    assert lines[-1] == sid, out


def test_sandbox_rlimits_come_from_its_config_not_the_daemon(images):
    """Open files and locked memory are set for each sandbox, not inherited:
    on cgroup v2 libcontainer raises its own locked-memory limit to 128 MiB
    to load the device program, and a sandbox must not keep that. A daemon
    with low soft limits shows the difference: the sandbox gets soft = hard
    = min(wanted, the daemon's hard limit)."""
    _, memlock_hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    _, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def low_soft_limits():
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, memlock_hard))
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, nofile_hard))

    def cap(hard, wanted):
        return wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)

    with own_daemon(images, preexec=low_soft_limits) as w:
        sid = w.create(cpu=0.1, memory="32M")["id"]
        limits = sh_ok(w, sid, "cat /proc/self/limits")
        rows = {line[:26].strip(): line[26:].split()[:2] for line in limits.splitlines()[1:]}
        want_memlock = str(cap(memlock_hard, 8 << 20))
        assert rows["Max locked memory"] == [want_memlock, want_memlock], limits
        want_nofile = str(cap(nofile_hard, 65536))
        assert rows["Max open files"] == [want_nofile, want_nofile], limits
        w.destroy(sid)


def test_fork_bomb_stops_at_pids_limit(warren, sandbox):
    sid = sandbox(pids=32)["id"]
    assert cgroup_read(sid, "pids", "pids.max").strip() == "32"
    other = sandbox()["id"]
    script = "i=0; while [ $i -lt 300 ]; do sleep 1000 & i=$((i+1)); done; echo survived $i"
    ev, out, err = sh(warren, sid, script, timeout="60s")
    assert "survived" not in out, out
    assert ev["code"] != 0 and not ev["timed_out"], ev
    assert "can't fork" in err or "Resource temporarily unavailable" in err, err

    current = int(cgroup_read(sid, "pids", "pids.current"))
    procs = sandbox_host_pids(sid)
    assert current <= 32 and len(procs) <= 32, (current, len(procs))
    assert len(procs) >= 16, f"the bomb only made {len(procs)} processes"
    events = cgroup_stat(sid, "pids", "pids.events")
    assert events.get("max", 0) > 0, events

    # The daemon and another sandbox are fine.
    assert httpx.get(warren.url + "/healthz", timeout=5).status_code == 200
    assert sh_ok(warren, other, "echo fine") == "fine\n"
    # And the bombed sandbox can still be destroyed completely.
    r = warren.destroy(sid)
    assert r.status_code == 200, r.text
    assert host_traces(warren, sid) == []


def test_memory_hog_is_oom_killed(warren, sandbox):
    other = sandbox()["id"]
    sid = sandbox(memory="64M")["id"]
    if CGROUP_V2:
        assert int(cgroup_read(sid, "memory", "memory.max")) == 64 << 20
        assert cgroup_read(sid, "memory", "memory.swap.max").strip() == "0"
    else:
        assert int(cgroup_read(sid, "memory", "memory.limit_in_bytes")) == 64 << 20
        try:
            memsw = int(cgroup_read(sid, "memory", "memory.memsw.limit_in_bytes"))
        except FileNotFoundError:  # swap accounting off: nothing to check
            memsw = None
        if memsw is not None:
            assert memsw == 64 << 20, "memory+swap must equal memory: no swap"

    ev, out, err = sh(warren, sid, 'x=$(head -c 150000000 /dev/zero | tr "\\0" a); echo survived ${#x}')
    assert "survived" not in out
    assert ev["code"] == 137 and ev.get("signal") == 9, ev
    assert not ev["timed_out"]

    assert httpx.get(warren.url + "/healthz", timeout=5).status_code == 200
    assert sh_ok(warren, other, "echo fine") == "fine\n"
    # The sandbox itself survives the OOM kill of one of its processes.
    assert sh_ok(warren, sid, "echo alive") == "alive\n"
    info = warren.http.get(f"/v1/sandboxes/{sid}").json()
    assert info["state"] == "running"
    assert info["usage"]["oom_kills"] >= 1, info["usage"]


def test_cpu_hog_is_throttled(warren, sandbox):
    sid = sandbox(cpu=0.2)["id"]
    if CGROUP_V2:
        assert cgroup_read(sid, "cpu", "cpu.max").split() == ["20000", "100000"]
    else:
        assert int(cgroup_read(sid, "cpu", "cpu.cfs_quota_us")) == 20000
        assert int(cgroup_read(sid, "cpu", "cpu.cfs_period_us")) == 100000
    throttled0 = cgroup_stat(sid, "cpu", "cpu.stat").get("nr_throttled", 0)
    used0 = cpu_usage_ns(sid)
    t0 = time.monotonic()
    ev, out, err = sh(warren, sid, "timeout 2 sh -c 'while :; do :; done'")
    wall_ns = (time.monotonic() - t0) * 1e9
    used = cpu_usage_ns(sid) - used0
    assert ev["code"] == 143, (ev, err)  # busybox timeout: SIGTERM
    assert wall_ns >= 1.9e9
    assert used <= 0.3 * wall_ns, f"used {used/1e9:.2f}s CPU in {wall_ns/1e9:.2f}s with cpu 0.2"
    assert used >= 0.02 * wall_ns, f"the loop barely ran: {used/1e9:.3f}s"
    throttled = cgroup_stat(sid, "cpu", "cpu.stat").get("nr_throttled", 0) - throttled0
    assert throttled > 0
    # The API reports the same counter.
    usage = warren.http.get(f"/v1/sandboxes/{sid}").json()["usage"]
    assert used0 + used <= usage["cpu_usage_ns"] <= cpu_usage_ns(sid), usage


def test_disk_limit_stops_writes_and_is_released(warren, sandbox):
    """--disk gives the sandbox its own file system: writes stop at the limit,
    the host's disk is untouched, and destroy releases the loop device."""
    info = sandbox(disk="32M")
    sid = info["id"]
    ex, out, err, _ = warren.exec(
        sid, ["sh", "-c", "dd if=/dev/zero of=/big bs=1M count=100; echo rc=$?; ls -l /big"]
    )
    text = (out + err).decode()
    assert "No space left on device" in text, text
    listing = next(line for line in out.decode().splitlines() if line.endswith("/big"))
    size = int(listing.split()[4])
    assert 16 << 20 <= size <= 32 << 20, text
    img = warren.home / "sandboxes" / sid / "disk.img"
    assert img.exists()
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert str(img) in loops
    assert warren.destroy(sid).status_code == 200
    deadline = time.time() + 5
    while str(img) in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout:
        assert time.time() < deadline, "loop device still attached after destroy"
        time.sleep(0.05)
    assert not img.exists()
