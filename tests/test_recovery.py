"""Durability: sandboxes outlive `kill -9` of `warren up`, a restart adopts
them (processes, main output, TTLs), records without a live sandbox become
`lost`, and leftovers without a record are swept, while look-alikes that are
not Warren's are left alone."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import own_daemon
from helpers import crash, host_traces, restart, sandbox_init_host_pid

# Runs again with the node over HTTP: inventory after a crash (docs/testing.md).
pytestmark = pytest.mark.contract


@pytest.fixture
def own_warren(images):
    with own_daemon(images) as w:
        yield w


def info(w, sid):
    return w.http.get(f"/v1/sandboxes/{sid}").json()


def test_kill_9_then_restart_adopts_everything(own_warren):
    w = own_warren
    idle = w.create()["id"]
    w.exec(idle, ["sh", "-c", "echo before > /tmp/mark; sleep 1000 &"])
    short = w.create(ttl="4s")["id"]
    t_short = time.time()
    main = w.create(cmd=["sh", "-c", "for i in $(seq 1 25); do echo line $i; sleep 0.1; done; exit 5"])["id"]
    inits = {sid: sandbox_init_host_pid(sid) for sid in (idle, short, main)}
    # Crash between two lines: a chunk the daemon has read in the very
    # instant it dies is lost with it (docs/configuration.md); what this
    # checks is that nothing written while no daemon reads is.
    deadline = time.time() + 5
    while "line 3" not in w.http.get(f"/v1/sandboxes/{main}/logs").text:
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(0.03)
    crash(w)
    time.sleep(1.0)
    # Nothing died with the daemon.
    for sid, pid in inits.items():
        assert Path(f"/proc/{pid}").exists(), f"{sid} died with the daemon"
    # How fast the restart serves is a benchmark figure, not asserted here.
    restart(w)
    a = info(w, idle)
    assert a["state"] == "running"
    ex, out, _, _ = w.exec(idle, ["sh", "-c", "cat /tmp/mark; ps -o args | grep -c '^sleep 1000$'"])
    assert ex["code"] == 0 and out.decode().split() == ["before", "1"]
    # The TTL kept running on the boot clock while the daemon was down.
    assert info(w, short)["state"] == "running"
    deadline = time.time() + 6
    while info(w, short)["state"] in ("running", "stopping"):
        assert time.time() < deadline
        time.sleep(0.05)
    s = info(w, short)
    assert s["state"] == "destroyed" and s["reason"] == "ttl_expired"
    assert 4.0 <= time.time() - t_short <= 6.5
    # The main process kept writing while no daemon read; nothing was lost.
    deadline = time.time() + 10
    while info(w, main)["state"] in ("running", "stopping"):
        assert time.time() < deadline
        time.sleep(0.05)
    m = info(w, main)
    assert m["state"] == "destroyed" and m["reason"] == "main_exited" and m["exit_code"] == 5
    text = w.http.get(f"/v1/sandboxes/{main}/logs").text
    import json

    out = "".join(json.loads(l).get("text", "") for l in text.splitlines() if '"stdout"' in l)
    assert out.split("\n")[:-1] == [f"line {i}" for i in range(1, 26)]
    assert host_traces(w, short) == [] and host_traces(w, main) == []
    w.destroy(idle)
    assert host_traces(w, idle) == []


def test_dead_sandbox_becomes_lost_and_is_cleaned(own_warren):
    w = own_warren
    sid = w.create()["id"]
    pid = sandbox_init_host_pid(sid)
    crash(w)
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    restart(w)
    s = info(w, sid)
    assert s["state"] == "lost" and s["reason"] == "node_lost", s
    assert "gone" in s["events"][-1]["message"]
    assert host_traces(w, sid) == []


def test_orphans_swept_and_lookalikes_left_alone(own_warren):
    w = own_warren
    orphan = "sbx-orphan000001"[:16]
    orphan = "sbx-" + "orphan000001"
    crash(w)
    sdir = w.home / "sandboxes" / orphan
    (sdir / "upper").mkdir(parents=True)
    cg = Path("/sys/fs/cgroup/pids") / w.cgroup_parent / orphan
    if not Path("/sys/fs/cgroup/pids").exists():
        cg = Path("/sys/fs/cgroup") / w.cgroup_parent / orphan
    cg.mkdir(parents=True, exist_ok=True)
    victim = subprocess.Popen(["sleep", "1000"])
    (cg / "cgroup.procs").write_text(str(victim.pid))
    # Look-alikes: not Warren ids, or not under Warren's cgroup parent.
    lookalike_dir = w.home / "sandboxes" / "sbx-NOT-OURS"
    lookalike_dir.mkdir()
    foreign_cg = cg.parent.parent / "warren-foreign" / orphan
    foreign_cg.mkdir(parents=True, exist_ok=True)
    try:
        restart(w)
        assert not sdir.exists()
        assert not cg.exists()
        assert victim.wait(timeout=5) == -signal.SIGKILL
        assert lookalike_dir.exists()
        assert foreign_cg.exists()
    finally:
        victim.kill()
        foreign_cg.rmdir()
        foreign_cg.parent.rmdir()
        shutil.rmtree(lookalike_dir, ignore_errors=True)


def test_restart_never_sweeps_another_homes_sandboxes(warren, own_warren):
    """Every Warren home on a host shares the cgroup parent; a restart sweeps
    only what lives in its own home."""
    theirs = warren.create(cpu=0.1, memory="32M")["id"]
    crash(own_warren)
    restart(own_warren)
    ex, _, _, _ = warren.exec(theirs, ["true"])
    assert ex["code"] == 0
    warren.destroy(theirs)
