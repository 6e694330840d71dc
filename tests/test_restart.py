"""Restarts that never hang: a `kill -9` of the daemon with sandboxes in
every state (running, paused with a main process, kept and frozen after an
OOM, in a `delay` grace period, queued for capacity), and a restart that
answers at once and takes each of them over as it was."""

import json
import sqlite3
import threading
import time
from pathlib import Path

import httpx

from conftest import own_daemon
from helpers import CGROUP_V2, cgroup_dir, cgroup_read, crash, host_traces, restart, sh_ok, wait_until
import pytest

# Runs again with the node over HTTP: inventory and events after a restart (docs/testing.md).
pytestmark = pytest.mark.contract

OOM = ["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"]


def state(w, sid):
    return w.http.get(f"/v1/sandboxes/{sid}").json()


def wait_state(w, sid, states, timeout=20):
    return wait_until(lambda: (s := state(w, sid))["state"] in states and s, timeout, what=f"{sid} in {states}")


def frozen(sid):
    try:
        return cgroup_read(sid, "freezer", "freezer.state").strip() == "FROZEN"
    except OSError:
        return cgroup_read(sid, "cpu", "cgroup.freeze").strip() == "1"


def stdout_lines(w, sid):
    text = w.http.get(f"/v1/sandboxes/{sid}/logs").text
    out = "".join(json.loads(l).get("text", "") for l in text.splitlines() if '"stdout"' in l)
    return out.splitlines()


def test_restart_with_sandboxes_in_every_state_answers_at_once(images):
    """Found by a hostile run: a kept (frozen) sandbox made the restarted
    daemon wait forever on its init, and /healthz never answered."""
    with own_daemon(images) as w:
        kept = w.create(memory="64M", reclaim="keep_on_failure", cmd=OOM)["id"]
        wait_state(w, kept, ("kept",))
        running = [w.create(cpu=0.1, memory="32M")["id"] for _ in range(3)]
        ticker = ["sh", "-c", "i=0; while [ $i -lt 30 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done; exit 7"]
        paused = w.create(cmd=ticker)["id"]
        wait_until(lambda: len(stdout_lines(w, paused)) >= 3, what="the ticker to start")
        assert w.http.post(f"/v1/sandboxes/{paused}/pause").json()["state"] == "paused"
        delayed = w.create(cmd=["true"], reclaim="delay", keep_for="5s")["id"]
        wait_state(w, delayed, ("stopping",))
        t_delayed = time.time()
        assert frozen(kept) and frozen(paused)

        crash(w)
        took = restart(w)
        assert took < 2.0, f"the restarted daemon answered after {took:.2f}s"

        assert state(w, kept)["state"] == "kept" and frozen(kept)
        for sid in running:
            assert state(w, sid)["state"] == "running"
            assert sh_ok(w, sid, "echo ok") == "ok\n"
        assert state(w, paused)["state"] == "paused" and frozen(paused)
        # Resumed, the main process carries on: its output was held by its
        # init, re-attached now, and its exit is seen.
        assert w.http.post(f"/v1/sandboxes/{paused}/resume").json()["state"] == "running"
        done = wait_state(w, paused, ("destroyed",), timeout=20)
        assert done["reason"] == "main_exited" and done["exit_code"] == 7, done
        assert stdout_lines(w, paused) == [f"tick {i}" for i in range(30)]
        # The grace period went on across the restart and ended on time.
        done = wait_state(w, delayed, ("destroyed",), timeout=15)
        assert done["reason"] == "main_exited", done
        assert time.time() - t_delayed < 12
        assert w.destroy(kept).json()["state"] == "destroyed"
        for sid in [kept, paused, delayed]:
            assert host_traces(w, sid) == []
        for sid in running:
            w.destroy(sid)
            assert host_traces(w, sid) == []


def test_a_crash_between_pause_and_its_record_is_undone(images):
    """The freezer follows the record: a sandbox frozen by a pause that was
    never recorded (nor answered) runs again after the restart."""
    with own_daemon(images) as w:
        sid = w.create(cpu=0.1, memory="32M")["id"]
        crash(w)
        if CGROUP_V2:
            (cgroup_dir(sid, "freezer") / "cgroup.freeze").write_text("1")
        else:
            (cgroup_dir(sid, "freezer") / "freezer.state").write_text("FROZEN")
        wait_until(lambda: frozen(sid), 5, what="the freeze")
        assert restart(w) < 2.0
        assert state(w, sid)["state"] == "running" and not frozen(sid)
        assert sh_ok(w, sid, "echo ok") == "ok\n"


def test_queued_creates_queue_again_after_a_restart(images):
    """A create answered `queued` (202) was acknowledged: after a crash it
    waits again, and starts when capacity frees."""
    with own_daemon(images, args=["--max-sandboxes", "1"]) as w:
        first = w.create(cpu=0.1, memory="32M")["id"]
        r = w.http.post("/v1/sandboxes", params={"wait": "false"}, json={"image": "busybox:latest", "cpu": 0.1, "memory": "32M"})
        assert r.status_code == 202, r.text
        queued = r.json()["id"]
        crash(w)
        restart(w)
        q = state(w, queued)
        assert q["state"] == "queued" and q["queue_position"] == 1, q
        w.destroy(first)
        wait_state(w, queued, ("running",))
        assert sh_ok(w, queued, "echo ok") == "ok\n"
        w.destroy(queued)


def test_an_unreadable_record_fails_alone(images):
    """Found by a hostile run: one record whose spec could not be read back
    made every list answer 500 and the daemon refuse to start. It is now
    retired (failed, corrupt_record), and everything else carries on."""
    with own_daemon(images) as w:
        bad = w.create(cpu=0.1, memory="32M")["id"]
        good = w.create(cpu=0.1, memory="32M")["id"]
        crash(w)
        # What an earlier Warren stored for `"ttl": 1083999999998`.
        db = sqlite3.connect(w.home / "warren.db")
        spec = json.loads(db.execute("SELECT spec FROM sandboxes WHERE id = ?", (bad,)).fetchone()[0])
        spec["ttl"] = "1083999999998s"
        db.execute("UPDATE sandboxes SET spec = ? WHERE id = ?", (json.dumps(spec), bad))
        db.commit()
        db.close()
        assert restart(w) < 2.0
        listed = w.http.get("/v1/sandboxes", params={"all": "true"})
        assert listed.status_code == 200, listed.text
        assert [s["id"] for s in listed.json() if s["state"] == "running"] == [good]
        evs = w.http.get("/v1/events", params={"sandbox": bad}).json()
        assert evs[-1]["reason"] == "corrupt_record", evs[-1]
        # Its sandbox, unknown now, was swept.
        assert host_traces(w, bad) == []
        assert sh_ok(w, good, "echo ok") == "ok\n"


def test_a_restart_with_many_sandboxes_answers_within_two_seconds(images):
    with own_daemon(images, args=["--cpu-overcommit", "256"]) as w:
        ids = []
        for i in range(60):
            spec = {"cpu": 0.05, "memory": "16M"}
            if i % 3 == 1:
                spec["cmd"] = ["sleep", "1000"]
            ids.append(w.create(**spec)["id"])
        for sid in ids[::5]:
            w.http.post(f"/v1/sandboxes/{sid}/pause")
        crash(w)
        took = restart(w)
        assert took < 2.0, took
        live = w.http.get("/v1/sandboxes").json()
        assert {s["id"] for s in live} == set(ids)
        assert sum(s["state"] == "paused" for s in live) == len(ids[::5])
        for sid in ids:
            w.destroy(sid)


def test_an_exec_cgroup_a_crash_left_frozen_does_not_wedge_the_sandbox(images):
    """Found by the fault-injection suite: the daemon was killed while it
    killed an exec (its cgroup frozen, not yet thawed); exec ids started
    again from zero after the restart, a new exec reused that frozen cgroup,
    its shim froze there, and the sandbox's init, waiting for it, stopped
    answering every later exec."""
    with own_daemon(images) as w:
        sid = w.create(cpu=0.1, memory="32M")["id"]
        def stream():
            try:
                w.exec(sid, ["sleep", "1000"], client=w.client())
            except httpx.HTTPError:
                pass  # the crash below cuts this stream

        streaming = threading.Thread(target=stream, daemon=True)
        streaming.start()
        cg = wait_until(lambda: next(iter(cgroup_dir(sid, "freezer").glob("ex-*")), None), 5,
                        what="the exec's cgroup")
        if (cg / "freezer.state").exists():
            (cg / "freezer.state").write_text("FROZEN")
        else:
            (cg / "cgroup.freeze").write_text("1")
        crash(w)
        assert restart(w) < 2.0
        t = time.time()
        for _ in range(3):
            assert sh_ok(w, sid, "echo ok") == "ok\n"
        assert time.time() - t < 5
        assert not cg.exists(), "the interrupted kill was finished and its cgroup removed"
        w.destroy(sid)
        assert host_traces(w, sid) == []
