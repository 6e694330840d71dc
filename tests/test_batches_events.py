"""Labels and batches, the event stream, logs that outlive their sandbox,
and the delay policy."""

import json
import threading
import time

import pytest

from helpers import host_traces

# Runs again with the node over HTTP: events, logs (docs/testing.md).
pytestmark = pytest.mark.contract


def members(warren, batch):
    return warren.http.get(
        "/v1/sandboxes", params={"label": f"warren.dev/batch={batch}", "all": "true"}
    ).json()


def wait_batch(warren, bid, pred, timeout=30):
    deadline = time.time() + timeout
    while True:
        b = warren.http.get(f"/v1/batches/{bid}").json()
        if pred(b):
            return b
        assert time.time() < deadline, b
        time.sleep(0.05)


def test_batch_create_status_and_delete(warren):
    r = warren.http.post(
        "/v1/batches",
        json={
            "count": 6,
            "spec": {"image": "busybox:latest", "cpu": 0.1, "memory": "32M", "labels": {"team": "rl"}},
            "labels": {"task": "swe", "code": "v3", "dataset": "d7"},
        },
    )
    assert r.status_code == 202, r.text
    bid = r.json()["id"]
    assert bid.startswith("bat-")
    b = wait_batch(warren, bid, lambda b: b["states"].get("running") == 6)
    assert b["submitted"] == 6 and b["failures"] == []
    assert b["usage"]["memory_bytes"] > 0 and b["usage"]["pids"] >= 6
    ms = members(warren, bid)
    assert len(ms) == 6
    for m in ms:
        assert m["spec"]["labels"] == {
            "team": "rl", "task": "swe", "code": "v3", "dataset": "d7", "warren.dev/batch": bid
        }
    assert any(x["id"] == bid for x in warren.http.get("/v1/batches").json())
    gone = warren.http.delete(f"/v1/batches/{bid}").json()
    assert gone["states"] == {"destroyed": 6} and gone["deleted_at"]
    for m in ms:
        assert host_traces(warren, m["id"]) == []


def test_batch_reports_failures(warren):
    bid = warren.http.post(
        "/v1/batches",
        json={"count": 4, "spec": {"image": "busybox:latest", "cpu": 0.1, "memory": "32M", "cmd": ["sh", "-c", "exit 3"]}},
    ).json()["id"]
    b = wait_batch(warren, bid, lambda b: b["states"].get("destroyed") == 4)
    assert len(b["failures"]) == 4
    assert {f["exit_code"] for f in b["failures"]} == {3}
    assert {f["reason"] for f in b["failures"]} == {"main_exited"} and b["succeeded"] == 0


def test_a_batchs_usage_lasts_after_its_sandboxes_are_gone(warren):
    bid = warren.http.post(
        "/v1/batches",
        json={"count": 3, "spec": {"image": "busybox:latest", "cpu": 0.5, "memory": "32M",
                                   "cmd": ["sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 2.5"]}},
    ).json()["id"]
    b = wait_batch(warren, bid, lambda b: b["states"].get("destroyed") == 3, timeout=60)
    u = b["usage"]
    # Summed over members none of which is alive: CPU-seconds, runtime and
    # memory over time, as each ended.
    assert u["cpu_usage_ns"] > 0 and u["runtime_ms"] >= 3 * 2500 and u["memory_byte_seconds"] > 0, u
    assert u["memory_bytes"] == 0 and u["pids"] == 0, u
    assert b["failures"] == [] and b["states"] == {"destroyed": 3}
    assert b["succeeded"] == 3, b
    cost = b["cost"]
    assert cost["cpu_seconds"] == pytest.approx(u["cpu_usage_ns"] / 1e9), cost
    assert cost["memory_gb_seconds"] == pytest.approx(u["memory_byte_seconds"] / 1e9), cost
    assert cost["gpu_seconds"] == 0, cost
    # `warren batch ls` shows them: 3 succeeded, the CPU- and GB-seconds.
    header, *rows = warren.cli("batch", "ls").stdout.decode().splitlines()
    assert header.split()[:8] == ["ID", "COUNT", "SUBMITTED", "OK", "FAILED", "CPU-S", "GB-S", "GPU-S"], header
    row = next(r.split() for r in rows if r.startswith(bid))
    assert row[1:5] == ["3", "3", "3", "0"] and float(row[5]) > 0, row
    assert row[5:8] == [f"{cost[k]:.3f}" for k in ("cpu_seconds", "memory_gb_seconds", "gpu_seconds")], row
    m = members(warren, bid)[0]
    ended = warren.http.get(f"/v1/sandboxes/{m['id']}").json()
    assert ended["state"] == "destroyed" and ended["usage"]["runtime_ms"] >= 2500, ended


def test_batch_bad_input(warren):
    assert warren.http.post("/v1/batches", json={"count": 0, "spec": {"image": "busybox:latest"}}).status_code == 400
    r = warren.http.post("/v1/batches", json={"count": 2, "spec": {"image": "nope:1"}})
    assert r.status_code == 404
    r = warren.http.post("/v1/batches", json={"count": 2, "spec": {"image": "busybox:latest"}, "labels": {"bad key": "x"}})
    assert r.status_code == 400
    assert warren.http.get("/v1/batches/bat-doesnotexist").status_code == 404


def test_label_selectors_on_list_and_bulk_delete(warren):
    ids = {
        name: warren.create(labels={"sel": "t1", "kind": name}, cpu=0.1, memory="32M")["id"]
        for name in ("a", "b", "c")
    }
    plain = warren.create(labels={"sel": "t1"}, cpu=0.1, memory="32M")["id"]

    def ls(sel):
        return sorted(s["id"] for s in warren.http.get("/v1/sandboxes", params={"label": sel}).json())

    assert ls("sel=t1,kind=a") == [ids["a"]]
    assert ls("sel=t1,kind!=a") == sorted([ids["b"], ids["c"], plain])
    assert ls("sel=t1,kind in (a,c)") == sorted([ids["a"], ids["c"]])
    assert ls("sel=t1,kind") == sorted(ids.values())
    assert ls("sel=t1,!kind") == [plain]
    r = warren.http.get("/v1/sandboxes", params={"label": "kind in (a"})
    assert r.status_code == 400
    gone = warren.http.delete("/v1/sandboxes", params={"label": "sel=t1,kind notin (b)"}).json()
    assert sorted(g["id"] for g in gone) == sorted([ids["a"], ids["c"], plain])
    assert ls("sel=t1") == [ids["b"]]
    warren.destroy(ids["b"])


def test_events_filter_and_follow(warren):
    got = []
    stop = threading.Event()

    def follow():
        with warren.client() as c:
            with c.stream("GET", "/v1/events", params={"label": "evt=follow", "follow": "true", "after": last}) as r:
                for line in r.iter_lines():
                    if line:
                        got.append(json.loads(line))
                    if stop.is_set() or len(got) >= 4:
                        return

    evs = warren.http.get("/v1/events", params={"limit": 10000}).json()
    last = evs[-1]["seq"] if evs else 0
    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(0.3)
    sid = warren.create(labels={"evt": "follow"}, cpu=0.1, memory="32M")["id"]
    other = warren.create(cpu=0.1, memory="32M")["id"]
    warren.destroy(sid)
    warren.destroy(other)
    t.join(timeout=10)
    stop.set()
    assert [(e["sandbox_id"], e["state"]) for e in got] == [
        (sid, "creating"), (sid, "running"), (sid, "stopping"), (sid, "destroyed")
    ], got
    by_type = warren.http.get("/v1/events", params={"type": "user_deleted", "after": last}).json()
    assert {e["sandbox_id"] for e in by_type} == {sid, other}
    assert {e["reason"] for e in by_type} == {"user_deleted"}


def test_logs_hold_exec_output_and_outlive_the_sandbox(warren):
    sid = warren.create(cpu=0.1, memory="32M")["id"]
    ex, _, _, _ = warren.exec(sid, ["sh", "-c", "echo from-exec; echo to-err >&2"])
    assert ex["code"] == 0
    warren.destroy(sid)
    lines = [json.loads(l) for l in warren.http.get(f"/v1/sandboxes/{sid}/logs").text.splitlines()]
    kinds = [l["kind"] for l in lines]
    assert {"stdout", "stderr", "event", "summary"} <= set(kinds)
    out = [l for l in lines if l["kind"] == "stdout"]
    assert out[0]["text"] == "from-exec\n" and out[0]["exec_id"].startswith("ex-")
    summary = next(l for l in lines if l["kind"] == "summary")
    assert summary["usage"]["cpu_usage_ns"] > 0
    assert lines[-1]["kind"] == "event" and lines[-1]["state"] == "destroyed"
    for l in lines:
        assert l["sandbox_id"] == sid and l["time"].endswith("Z")


def test_delay_policy_grace_then_destroy(warren):
    sid = warren.create(
        cmd=["sh", "-c", "echo done > /tmp/out; exit 0"], reclaim="delay", keep_for="2s", cpu=0.1, memory="32M"
    )["id"]
    deadline = time.time() + 5
    while (s := warren.http.get(f"/v1/sandboxes/{sid}").json())["state"] == "running":
        assert time.time() < deadline
        time.sleep(0.05)
    assert s["state"] == "stopping" and s["reason"] == "main_exited"
    r = warren.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/out"})
    assert r.status_code == 200 and r.content == b"done\n"
    t = time.time()
    deadline = t + 6
    while (s := warren.http.get(f"/v1/sandboxes/{sid}").json())["state"] == "stopping":
        assert time.time() < deadline
        time.sleep(0.05)
    assert s["state"] == "destroyed" and s["reason"] == "main_exited"
    assert host_traces(warren, sid) == []


def test_log_retention_removes_old_logs_of_finished_sandboxes(images):
    from conftest import own_daemon

    with own_daemon(images, ["--log-retention", "1s"]) as w:
        done = w.create(cpu=0.1, memory="32M")["id"]
        live = w.create(cpu=0.1, memory="32M")["id"]
        w.destroy(done)
        assert w.http.get(f"/v1/sandboxes/{done}/logs").status_code == 200
        deadline = time.time() + 8
        while (w.home / "logs" / f"{done}.jsonl").exists():
            assert time.time() < deadline
            time.sleep(0.1)
        # The copy the control plane keeps goes with the same retention.
        while w.http.get(f"/v1/sandboxes/{done}/logs").status_code != 404:
            assert time.time() < deadline
            time.sleep(0.1)
        # A live sandbox's log stays however old it is.
        time.sleep(1.5)
        assert (w.home / "logs" / f"{live}.jsonl").exists()
        w.destroy(live)
