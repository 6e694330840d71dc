"""Lifetime and reclaim: TTLs and leases enforced by the node on the
monotonic clock, pause/resume through the freezer, keep policies."""

import time
from pathlib import Path

import pytest

from helpers import CGROUP_V2, cgroup_read

# Runs again with the node over HTTP: set_paused, hold, set_ttl, renew_lease (docs/testing.md).
pytestmark = pytest.mark.contract


def state(warren, sid):
    return warren.http.get(f"/v1/sandboxes/{sid}").json()


def wait_final(warren, sid, timeout):
    """Polls without touching the lease (GET renews it), via the list endpoint."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = warren.http.get("/v1/sandboxes", params={"all": "true"}).json()
        row = next(r for r in rows if r["id"] == sid)
        if row["state"] in ("destroyed", "kept", "failed", "lost"):
            return row, time.time()
        time.sleep(0.05)
    raise AssertionError(f"{sid} still {row['state']} after {timeout}s")


def freezer_state(sid):
    if not CGROUP_V2:
        return cgroup_read(sid, "freezer", "freezer.state").strip()
    return {"1": "FROZEN", "0": "THAWED"}[cgroup_read(sid, "freezer", "cgroup.freeze").strip()]


def test_ttl_expires_on_time_and_not_before(warren):
    t0 = time.time()
    sid = warren.create(ttl="2s")["id"]
    time.sleep(1.5)
    assert state(warren, sid)["state"] == "running"
    row, t_end = wait_final(warren, sid, 6)
    assert row["state"] == "destroyed" and row["reason"] == "ttl_expired"
    assert 2.0 <= t_end - t0 <= 4.0, t_end - t0


def test_lease_renewed_by_heartbeat_then_expires(warren):
    sid = warren.create(lease="1500ms")["id"]
    for _ in range(4):
        time.sleep(0.7)
        # Taken before the call: the lease is renewed while it runs, before
        # its answer (which reads the node's status) comes back.
        t_last = time.time()
        r = warren.http.post(f"/v1/sandboxes/{sid}/heartbeat")
        assert r.status_code == 200 and r.json()["state"] == "running"
        assert 0 < r.json()["lease_remaining_ms"] <= 1500
    row, t_end = wait_final(warren, sid, 6)
    assert row["state"] == "destroyed" and row["reason"] == "lease_expired"
    assert 1.5 <= t_end - t_last <= 3.5, t_end - t_last


def test_any_call_renews_the_lease(warren):
    sid = warren.create(lease="1500ms")["id"]
    for _ in range(4):
        time.sleep(0.7)
        ex, out, _, _ = warren.exec(sid, ["true"])
        assert ex["code"] == 0
    assert state(warren, sid)["state"] == "running"
    warren.destroy(sid)


def test_ttl_can_be_extended_and_shortened(warren):
    sid = warren.create(ttl="2s")["id"]
    r = warren.http.post(f"/v1/sandboxes/{sid}/ttl", json={"ttl": "30s"})
    assert r.status_code == 200 and r.json()["ttl_remaining_ms"] > 20_000
    time.sleep(2.5)
    assert state(warren, sid)["state"] == "running"
    assert warren.http.post(f"/v1/sandboxes/{sid}/ttl", json={"ttl": "0s"}).status_code == 400
    warren.http.post(f"/v1/sandboxes/{sid}/ttl", json={"ttl": "1s"})
    row, _ = wait_final(warren, sid, 5)
    assert row["reason"] == "ttl_expired"
    r = warren.http.post(f"/v1/sandboxes/{sid}/ttl", json={"ttl": "1m"})
    assert r.status_code == 409


def test_pause_freezes_and_resume_thaws(warren, sandbox):
    sid = sandbox()["id"]
    warren.exec(sid, ["sh", "-c", "while true; do echo x >> /tmp/ticks; sleep 0.05; done >/dev/null 2>&1 &"])
    r = warren.http.post(f"/v1/sandboxes/{sid}/pause")
    assert r.status_code == 200 and r.json()["state"] == "paused"
    assert freezer_state(sid) == "FROZEN"
    size = len(warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/ticks"}).content)
    time.sleep(0.5)
    assert len(warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/ticks"}).content) == size
    r, _, _, _ = warren.exec(sid, ["true"])
    assert r.status_code == 409
    assert warren.http.post(f"/v1/sandboxes/{sid}/pause").json()["state"] == "paused"
    r = warren.http.post(f"/v1/sandboxes/{sid}/resume")
    assert r.status_code == 200 and r.json()["state"] == "running"
    assert freezer_state(sid) == "THAWED"
    ex, _, _, _ = warren.exec(sid, ["true"])
    assert ex["code"] == 0
    assert warren.http.post(f"/v1/sandboxes/{sid}/resume").json()["state"] == "running"


def test_paused_sandbox_destroys_cleanly(warren):
    sid = warren.create()["id"]
    warren.exec(sid, ["sh", "-c", "sleep 1000 &"])
    warren.http.post(f"/v1/sandboxes/{sid}/pause")
    r = warren.destroy(sid)
    assert r.status_code == 200 and r.json()["state"] == "destroyed"
    assert not (warren.home / "sandboxes" / sid).exists()


def test_keep_freezes_keeps_files_then_expires(warren):
    info = warren.create(cmd=["sh", "-c", "echo kept > /tmp/result; sleep 1000 & exit 1"], reclaim="keep", keep_for="2s")
    sid = info["id"]
    row, t_kept = wait_final(warren, sid, 10)
    assert row["state"] == "kept" and row["reason"] == "main_exited" and row["exit_code"] == 1
    assert freezer_state(sid) == "FROZEN"
    r = warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/result"})
    assert r.status_code == 200 and r.content == b"kept\n"
    # An exec looks at the scene: the node thaws the sandbox for it and
    # freezes it again once the last one has ended (just after its exit
    # event has gone out).
    ev, out, _, _ = warren.exec(sid, ["cat", "/tmp/result"])
    assert ev is not None and ev["code"] == 0 and out == b"kept\n", ev
    frozen_by = time.time() + 5
    while freezer_state(sid) != "FROZEN":
        assert time.time() < frozen_by, "not frozen again after the exec"
        time.sleep(0.02)
    deadline = time.time() + 6
    while state(warren, sid)["state"] in ("kept", "stopping"):
        assert time.time() < deadline
        time.sleep(0.05)
    final = state(warren, sid)
    assert final["state"] == "destroyed" and final["reason"] == "keep_expired"
    assert time.time() - t_kept >= 1.5
    assert not (warren.home / "sandboxes" / sid).exists()


def test_reclaim_changes_on_a_running_sandbox(warren):
    """A sandbox made to be destroyed is told to keep its scene while it
    runs: when its main process ends it is kept; the change is in its
    spec and events; bad values and ended sandboxes are refused."""
    sid = warren.create(cmd=["sh", "-c", "echo scene > /tmp/s; while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 4"])["id"]
    r = warren.http.post(f"/v1/sandboxes/{sid}/reclaim", json={"reclaim": "keep", "keep_for": "30s"})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["reclaim"] == "keep" and r.json()["spec"]["keep_for"] in (30, 30.0, "30s"), r.json()["spec"]
    for bad in ({"reclaim": "forever"}, {"reclaim": "keep", "keep_for": "0s"}, {"reclaim": "keep", "ttl": "1h"}):
        r = warren.http.post(f"/v1/sandboxes/{sid}/reclaim", json=bad)
        assert r.status_code in (400, 422), (bad, r.status_code, r.text)
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["spec"]["reclaim"] == "keep"
    # Still running (it waits for /tmp/go): now let it end.
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    ev, _, _, _ = warren.exec(sid, ["touch", "/tmp/go"])
    assert ev and ev["code"] == 0, ev
    row, _ = wait_final(warren, sid, 10)
    assert row["state"] == "kept" and row["exit_code"] == 4, row
    r = warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/s"})
    assert r.content == b"scene\n"
    events = warren.http.get("/v1/events", params={"sandbox": sid}).json()
    assert any(e.get("reason") == "reclaim_changed" for e in events), events
    # Kept now: its end is decided.
    r = warren.http.post(f"/v1/sandboxes/{sid}/reclaim", json={"reclaim": "destroy"})
    assert r.status_code == 409, r.text
    warren.destroy(sid)
    # The CLI says the same.
    sid = warren.create()["id"]
    out = warren.cli("reclaim", sid, "keep_on_failure", "--keep-for", "1m").stdout.decode()
    assert out.split() == [sid, "running"], out
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["spec"]["reclaim"] == "keep_on_failure"
    p = warren.cli("reclaim", sid, "keep", "--keep-for", "soon", check=False)
    assert p.returncode != 0 and b"soon" in p.stderr, p.stderr
    warren.destroy(sid)


@pytest.mark.parametrize("code,expected", [(0, "destroyed"), (3, "kept")])
def test_keep_on_failure(warren, code, expected):
    sid = warren.create(cmd=["sh", "-c", f"exit {code}"], reclaim="keep_on_failure")["id"]
    row, _ = wait_final(warren, sid, 10)
    assert row["state"] == expected and row["exit_code"] == code
    if expected == "kept":
        assert warren.destroy(sid).json()["state"] == "destroyed"


@pytest.mark.serial  # steps the host's clock an hour
def test_wall_clock_steps_change_neither_ttl_nor_lease(warren):
    """TTL and lease run on the monotonic clock: stepping the wall clock an
    hour forward (then back) neither expires nor extends anything."""
    offset = time.time() - time.monotonic()
    try:
        time.clock_settime(time.CLOCK_REALTIME, time.time())
    except PermissionError:
        pytest.skip("cannot set the wall clock here (no CAP_SYS_TIME)")
    ttl_sid = warren.create(ttl="3s")["id"]
    lease_sid = warren.create(lease="2s")["id"]
    t0 = time.monotonic()
    try:
        time.clock_settime(time.CLOCK_REALTIME, time.monotonic() + offset + 3600)
        time.sleep(1.0)
        assert state(warren, ttl_sid)["state"] == "running"
        assert warren.http.post(f"/v1/sandboxes/{lease_sid}/heartbeat").json()["state"] == "running"
        time.clock_settime(time.CLOCK_REALTIME, time.monotonic() + offset - 3600)
        time.sleep(0.5)
        assert state(warren, ttl_sid)["state"] == "running"
    finally:
        time.clock_settime(time.CLOCK_REALTIME, time.monotonic() + offset)
    for sid, why in ((ttl_sid, "ttl_expired"), (lease_sid, "lease_expired")):
        # wait_final polls the list, which (unlike GET of the sandbox) does
        # not renew the lease.
        row, _ = wait_final(warren, sid, 8)
        assert row["state"] == "destroyed" and row["reason"] == why, row
    assert 3.0 <= time.monotonic() - t0 <= 5.5


def test_request_id_makes_create_idempotent(warren):
    import concurrent.futures

    first = warren.http.post("/v1/sandboxes", json={"image": "busybox:latest", "request_id": "rid-once"})
    again = warren.http.post("/v1/sandboxes", json={"image": "busybox:latest", "request_id": "rid-once"})
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    spec = {"image": "busybox:latest", "request_id": "rid-race", "labels": {"rid": "race"}}

    def post(_):
        with warren.client() as c:
            return c.post("/v1/sandboxes", json=spec)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        rs = list(pool.map(post, range(6)))
    assert {r.status_code for r in rs} <= {200, 201}
    assert len({r.json()["id"] for r in rs}) == 1
    live = warren.http.get("/v1/sandboxes", params={"label": "rid=race"}).json()
    assert len(live) == 1
    assert not [p for p in (warren.home / "sandboxes").iterdir() if p.name not in {s["id"] for s in warren.http.get("/v1/sandboxes").json()}]
    warren.destroy(first.json()["id"])
    warren.destroy(live[0]["id"])


def test_keep_on_failure_keeps_an_oom_killed_sandbox(warren):
    sid = warren.create(
        memory="32M",
        reclaim="keep_on_failure",
        cmd=["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"],
    )["id"]
    row, _ = wait_final(warren, sid, 20)
    assert row["state"] == "kept" and row["reason"] == "oom_killed", row
    assert row["exit_code"] == 137
    assert warren.destroy(sid).json()["state"] == "destroyed"


def test_logs_by_label(warren):
    a = warren.create(labels={"logsel": "yes"}, cmd=["sh", "-c", "echo from-a"])["id"]
    b = warren.create(labels={"logsel": "yes"}, cmd=["sh", "-c", "echo from-b"])["id"]
    c = warren.create(labels={"logsel": "no"}, cmd=["sh", "-c", "echo from-c"])["id"]
    for sid in (a, b, c):
        wait_final(warren, sid, 10)
    import json as _json

    lines = [_json.loads(l) for l in warren.http.get("/v1/logs", params={"label": "logsel=yes"}).text.splitlines()]
    assert {l["sandbox_id"] for l in lines} == {a, b}
    assert sorted(l["text"] for l in lines if l["kind"] == "stdout") == ["from-a\n", "from-b\n"]
    assert warren.http.get("/v1/logs").status_code == 400
