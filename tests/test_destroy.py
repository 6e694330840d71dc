"""Destruction removes everything (docs/architecture.md), checked from the host."""

import threading
import time
from pathlib import Path

import pytest

from helpers import (
    host_traces,
    proc_state,
    sandbox_host_pids,
    sandbox_init_host_pid,
    sh_ok,
    state_root,
    uniq,
    wait_until,
)

# Runs again with the node over HTTP: destroy (docs/testing.md).
pytestmark = pytest.mark.contract


def busy_sandbox(warren, *create_args):
    """A CLI-created sandbox with files written and a background process left behind."""
    p = warren.cli("create", "--image", "busybox:latest", *create_args)
    sid = p.stdout.decode().strip()
    assert sid.startswith("sbx-") and len(sid.split()) == 1, p.stdout
    sh_ok(warren, sid, "dd if=/dev/zero of=/tmp/junk bs=1k count=64 2>/dev/null; (sleep 1000 &) ; sleep 1000 >/dev/null 2>&1 &")
    return sid


def assert_all_kinds_present(warren, sid):
    """Positive control for host_traces: each kind of trace exists while the sandbox lives."""
    traces = host_traces(warren, sid)
    kinds = {t.split(":", 1)[0].split(" ")[0] for t in traces}
    assert {"path", "cgroup", "uids", "process"} <= kinds, traces
    # The sandbox's root is mounted only inside its own mount namespace: the
    # host's, the daemon's and the spawners' tables never carry it.
    assert "mount" not in kinds, traces
    init = sandbox_init_host_pid(sid)
    assert sid in Path(f"/proc/{init}/mountinfo").read_text()
    assert any(f"sandboxes/{sid}" in t for t in traces if t.startswith("path"))
    # libcontainer's state, which exists only where libcontainer still sets
    # sandboxes up (cgroup v2 hosts); Warren's own set-up keeps none.
    libcontainer = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    has_state = any(str(state_root(warren.home) / sid) in t for t in traces if t.startswith("path"))
    assert has_state == libcontainer, traces
    assert len(sandbox_host_pids(sid)) >= 3  # init + two sleeps


@pytest.mark.smoke  # destroy
def test_rm_leaves_nothing_on_host(warren):
    sid = busy_sandbox(warren)
    assert_all_kinds_present(warren, sid)
    p = warren.cli("rm", sid)
    assert p.stdout.decode().split() == [sid, "destroyed"]
    assert host_traces(warren, sid) == []
    info = warren.http.get(f"/v1/sandboxes/{sid}").json()
    assert info["state"] == "destroyed" and info["reason"] == "user_deleted"
    assert [e["state"] for e in info["events"]][-1] == "destroyed"
    events = warren.http.get("/v1/events", params={"sandbox": sid}).json()
    assert events and all(e["sandbox_id"] == sid for e in events)
    states = [e["state"] for e in events if e["type"] == "state"]
    assert states[0] == "creating" and "running" in states and states[-1] == "destroyed", states
    assert events[-1]["reason"] == "user_deleted"
    # Not listed as live any more; still listed with --all.
    live = [s["id"] for s in warren.http.get("/v1/sandboxes").json()]
    every = [s["id"] for s in warren.http.get("/v1/sandboxes", params={"all": "true"}).json()]
    assert sid not in live and sid in every
    # Destroying again is harmless.
    r = warren.destroy(sid)
    assert r.status_code in (200, 409), r.text
    assert host_traces(warren, sid) == []


def test_destroy_reaps_init_process(warren):
    """The sandbox's init is reaped too: no zombie per destroyed sandbox."""
    sid = warren.create()["id"]
    init = sandbox_init_host_pid(sid)
    assert proc_state(init) in ("S", "R")
    assert warren.destroy(sid).status_code == 200
    wait_until(lambda: proc_state(init) is None, timeout=3, what=f"init {init} to be reaped (state {proc_state(init)})")


def test_bulk_rm_by_label(warren):
    label = uniq("batch")
    ids = [busy_sandbox(warren, "--label", f"batch={label}") for _ in range(3)]
    keep = warren.create(labels={"batch": label + "-other"})["id"]
    try:
        p = warren.cli("rm", "--label", f"batch={label}")
        removed = {l.split()[0] for l in p.stdout.decode().splitlines()}
        assert removed == set(ids)
        for sid in ids:
            assert host_traces(warren, sid) == []
        assert warren.http.get(f"/v1/sandboxes/{keep}").json()["state"] == "running"
        assert sh_ok(warren, keep, "echo still") == "still\n"
    finally:
        warren.destroy(keep)


def test_destroy_while_exec_streams_ends_the_stream(warren):
    sid = warren.create()["id"]
    started = threading.Event()
    result = {}

    def stream():
        import base64
        import json

        events = []
        with warren.client() as c:
            try:
                with c.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": ["sh", "-c", "echo started; sleep 100"]}) as r:
                    for line in r.iter_lines():
                        if not line:
                            continue
                        ev = json.loads(line)
                        events.append(ev)
                        if ev["type"] == "stdout" and b"started" in base64.b64decode(ev["data"]):
                            started.set()
            except Exception as e:  # a cut connection also ends the stream
                result["error"] = repr(e)
        result["events"] = events
        result["ended"] = time.monotonic()

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    assert started.wait(15), "exec never printed 'started'"
    t0 = time.monotonic()
    r = warren.destroy(sid)
    assert r.status_code == 200, r.text
    t.join(20)
    assert not t.is_alive(), "the exec stream is still open 20 s after destroy"
    assert result["ended"] - t0 < 20
    exits = [e for e in result["events"] if e["type"] == "exit"]
    assert not exits or exits[0]["code"] != 0, exits
    assert host_traces(warren, sid) == []


def test_run_rm_leaves_nothing(warren):
    label = uniq("runrm")
    p = warren.cli(
        "run", "--image", "busybox:latest", "--label", f"t={label}", "--rm", "--",
        "sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo main-done", check=False,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"main-done\n"
    found = warren.http.get("/v1/sandboxes", params={"label": f"t={label}", "all": "true"}).json()
    assert len(found) == 1
    sid = found[0]["id"]
    assert found[0]["state"] == "destroyed", found[0]
    assert host_traces(warren, sid) == []


def test_run_rm_of_failing_command_leaves_nothing(warren):
    label = uniq("runrm")
    p = warren.cli("run", "--image", "busybox:latest", "--label", f"t={label}", "--rm", "--", "sh", "-c", "exit 9", check=False)
    assert p.returncode == 9, p.stderr
    found = warren.http.get("/v1/sandboxes", params={"label": f"t={label}", "all": "true"}).json()
    assert len(found) == 1 and found[0]["state"] == "destroyed", found
    assert found[0]["exit_code"] == 9
    assert host_traces(warren, found[0]["id"]) == []
