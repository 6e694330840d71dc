"""`POST /v1/run` and `warren run --rm`: one request creates a sandbox for a
command, streams its state and output, answers its exit and removes it;
a run that has to queue says where it stands; a client that leaves takes
its sandbox with it."""

import base64
import json
import subprocess
import threading
import time

import httpx
import pytest

from conftest import WARREN, own_daemon
from helpers import host_traces

# Runs again with the node over HTTP: start_main (docs/testing.md).
pytestmark = pytest.mark.contract


def lines(resp):
    return [json.loads(l) for l in resp.iter_lines() if l]


def wait_gone(w, sid, timeout=10):
    deadline = time.time() + timeout
    while True:
        rows = [r for r in w.http.get("/v1/sandboxes", params={"all": "true"}).json() if r["id"] == sid]
        if rows and rows[0]["state"] == "destroyed":
            return rows[0]
        assert time.time() < deadline, rows
        time.sleep(0.05)


def test_run_streams_state_output_and_exit_then_removes(warren):
    body = {
        "spec": {"image": "busybox:latest", "cmd": ["sh", "-c", "read x; echo out $x; echo err >&2; exit 3"], "labels": {"t": "run"}},
        "stdin": base64.b64encode(b"fed\n").decode(),
    }
    with warren.http.stream("POST", "/v1/run", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        evs = lines(r)
    assert evs[0]["sandbox"]["state"] == "running", evs
    sid = evs[0]["sandbox"]["id"]
    out = b"".join(base64.b64decode(e["data"]) for e in evs if e.get("type") == "stdout")
    err = b"".join(base64.b64decode(e["data"]) for e in evs if e.get("type") == "stderr")
    assert (out, err) == (b"out fed\n", b"err\n")
    assert evs[-2]["type"] == "exit" and evs[-2]["code"] == 3
    # The last line comes once the sandbox is gone.
    assert evs[-1] == {"sandbox": {"id": sid, "state": "destroyed"}}
    row = next(r for r in warren.http.get("/v1/sandboxes", params={"all": "true"}).json() if r["id"] == sid)
    assert row["state"] == "destroyed" and row["reason"] == "run_ended" and row["spec"]["labels"] == {"t": "run"}


def read_to_exit(client, body, daemon_dies=False):
    """Reads a run's stream up to its exit line and stops there, as
    `warren run --rm` does; returns (sandbox id, exit event). A daemon
    that dies as it sends the exit may cut the stream before the line."""
    sid = None
    try:
        with client.stream("POST", "/v1/run", json=body) as r:
            for line in r.iter_lines():
                ev = json.loads(line)
                sid = ev.get("sandbox", {}).get("id", sid)
                if ev.get("type") == "exit":
                    return sid, ev
    except httpx.RemoteProtocolError:
        if daemon_dies and sid:
            return sid, None
        raise
    raise AssertionError(f"no exit line for {sid}")


def test_at_the_exit_line_the_sandbox_is_already_recorded_stopping(warren):
    """A client may stop at the exit line: by then the record says the
    sandbox is stopping (or gone), with the exit code; never running."""
    sid, ev = read_to_exit(warren.http, {"spec": {"image": "busybox:latest", "cmd": ["sh", "-c", "exit 5"]}})
    row = warren.http.get(f"/v1/sandboxes/{sid}").json()
    assert ev["code"] == 5 and row["state"] in ("stopping", "destroyed") and row["exit_code"] == 5, row
    row = wait_gone(warren, sid)
    assert (row["reason"], row["exit_code"]) == ("run_ended", 5), row


def test_a_daemon_that_dies_after_the_exit_line_removes_the_sandbox_on_restart(images):
    with own_daemon(images, env={"WARREN_CRASH_AT": "run:exit_sent"}) as w:
        sid, ev = read_to_exit(w.http, {"spec": {"image": "busybox:latest", "cmd": ["sh", "-c", "exit 7"]}}, daemon_dies=True)
        assert ev is None or ev["code"] == 7, ev
        assert w.proc.wait(timeout=10) != 0, "the daemon should have aborted"
        w.extra_env = {}
        w.start()
        row = wait_gone(w, sid)
        assert (row["reason"], row["exit_code"]) == ("run_ended", 7), row
        assert host_traces(w, sid) == []


def test_run_refuses_bad_input_before_making_anything(warren):
    before = len(warren.http.get("/v1/sandboxes", params={"all": "true"}).json())
    r = warren.http.post("/v1/run", json={"spec": {"image": "busybox:latest"}})
    assert r.status_code == 400 and "needs a command" in r.json()["error"]["message"], r.text
    r = warren.http.post("/v1/run", json={"spec": {"image": "busybox:latest", "cmd": ["true"], "memory": "1M"}})
    assert r.status_code == 400 and "memory" in r.json()["error"]["message"], r.text
    r = warren.http.post("/v1/run", json={"spec": {"image": "busybox:latest", "cmd": ["true"]}, "stdin": "not base64!"})
    assert r.status_code == 400, r.text
    r = warren.http.post("/v1/run", json={"spec": {"image": "no-such-image:1", "cmd": ["true"]}})
    assert r.status_code == 404, r.text
    assert len(warren.http.get("/v1/sandboxes", params={"all": "true"}).json()) == before


def test_cli_run_rm_is_one_request_and_leaves_nothing(warren):
    p = warren.cli("run", "--rm", "--image", "busybox:latest", "--label", "t=clirm", "--", "sh", "-c", "echo hi; exit 4", check=False)
    assert (p.returncode, p.stdout) == (4, b"hi\n"), p.stderr
    rows = warren.http.get("/v1/sandboxes", params={"all": "true", "label": "t=clirm"}).json()
    assert len(rows) == 1
    # Removed as a run is (an exec in an idle sandbox), not as a main
    # process that exited and was then deleted.
    assert wait_gone(warren, rows[0]["id"])["reason"] == "run_ended"


def test_a_queued_run_says_where_it_waits_and_a_client_that_leaves_takes_its_sandbox(images):
    with own_daemon(images, ["--max-sandboxes", "1"]) as w:
        holder = w.create()["id"]
        # A run that has to wait: its first line says so, with its place.
        got = {}

        def run_queued():
            with w.client() as c, c.stream("POST", "/v1/run", json={"spec": {"image": "busybox:latest", "cmd": ["echo", "late"]}}) as r:
                got["status"] = r.status_code
                got["events"] = lines(r)

        t = threading.Thread(target=run_queued)
        t.start()
        deadline = time.time() + 10
        while not [s for s in w.http.get("/v1/sandboxes").json() if s["state"] == "queued"]:
            assert time.time() < deadline
            time.sleep(0.05)
        w.destroy(holder)
        t.join(30)
        evs = got["events"]
        assert evs[0]["sandbox"]["state"] == "queued" and evs[0]["sandbox"]["queue_position"] == 1, evs
        assert evs[1]["sandbox"]["state"] == "running"
        assert base64.b64decode(evs[2 if evs[2].get("type") == "stdout" else 3]["data"]) == b"late\n", evs
        assert evs[-2] == {**evs[-2], "type": "exit", "code": 0}
        assert evs[-1]["sandbox"]["state"] == "destroyed"
        # The CLI prints the queue position on stderr while it waits.
        holder = w.create()["id"]
        proc = subprocess.Popen([str(WARREN), "run", "--rm", "--image", "busybox:latest", "--", "echo", "later"],
                                env=w.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 10
        while not [s for s in w.http.get("/v1/sandboxes").json() if s["state"] == "queued"]:
            assert time.time() < deadline
            time.sleep(0.05)
        w.destroy(holder)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and out == b"later\n", err
        assert b"queued at position 1" in err, err
        # A client that leaves mid-command: the command and its sandbox go.
        with w.client() as c, c.stream("POST", "/v1/run", json={"spec": {"image": "busybox:latest", "cmd": ["sleep", "300"]}}) as r:
            first = json.loads(next(r.iter_lines()))
            sid = first["sandbox"]["id"]
        row = wait_gone(w, sid, timeout=10)
        assert row["reason"] == "run_ended"
