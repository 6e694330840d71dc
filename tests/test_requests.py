"""Requests vs limits: admission and placement count what a sandbox
reserves (`cpu_request`, `memory_request`), the cgroup enforces its limits
(`cpu`, `memory`); with no flags a sandbox reserves 10m and 16M, so a
default node holds thousands; under host memory pressure the sandbox
furthest above its request is stopped and one within its request never is."""

import time

import pytest

from conftest import own_daemon

MIB = 1 << 20


def get(w, sid):
    return w.http.get(f"/v1/sandboxes/{sid}").json()


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while not (v := pred()):
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return v


def test_defaults_reserve_little_and_a_default_node_admits_thousands(warren):
    sid = warren.create()["id"]
    r = get(warren, sid)["resources"]
    # Limits stay what they were; the reservation is small.
    assert (r["cpu_millis"], r["memory"]) == (1000, 512 * MIB)
    assert (r["cpu_request_millis"], r["memory_request"]) == (10, 16 * MIB)
    node = warren.http.get("/v1/nodes").json()[0]
    assert node["allocated"]["cpu_millis"] >= 10 and node["allocated"]["memory"] >= 16 * MIB
    fits = min(
        node["allocatable"]["cpu_millis"] // 10,
        node["allocatable"]["memory"] // (16 * MIB),
        node["allocatable"]["slots"],
    )
    # This machine (2 cores, 24 GB) and the production ones it stands for.
    assert fits >= 1000, node
    warren.destroy(sid)
    # A limit given alone is also the request, as in Kubernetes.
    sid = warren.create(cpu="500m", memory="64M")["id"]
    r = get(warren, sid)["resources"]
    assert (r["cpu_request_millis"], r["memory_request"]) == (500, 64 * MIB)
    warren.destroy(sid)


def test_a_request_above_its_limit_is_refused_and_changes_nothing(warren):
    before = len(warren.http.get("/v1/sandboxes").json())
    r = warren.http.post("/v1/sandboxes", json={"image": "busybox:latest", "memory": "64M", "memory_request": "128M"})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "memory_request" in msg and "limit" in msg and "--memory-request" in msg
    r = warren.http.post("/v1/sandboxes", json={"image": "busybox:latest", "cpu_request": 2})
    assert r.status_code == 400 and "cpu_request" in r.json()["error"]["message"], r.text
    p = warren.cli("create", "--image", "busybox:latest", "--cpu", "1", "--cpu-request", "2", check=False)
    assert p.returncode != 0 and b"cpu_request" in p.stderr, p.stderr
    assert len(warren.http.get("/v1/sandboxes").json()) == before


def test_admission_counts_requests_and_the_cgroup_enforces_limits(images):
    # A node lending 256M: sixteen default sandboxes (16M each) fit, the
    # seventeenth waits; sandboxes asking for their limit get one each.
    args = ["--capacity-memory", "256M", "--reserve-memory", "0", "--queue-limit", "8"]
    with own_daemon(images, args) as w:
        live = [w.create()["id"] for _ in range(16)]
        r = w.http.post("/v1/sandboxes", params={"wait": "false"}, json={"image": "busybox:latest"})
        assert r.status_code == 202 and r.json()["state"] == "queued", r.text
        queued = r.json()["id"]
        w.destroy(live.pop())
        wait_for(lambda: get(w, queued)["state"] == "running", 10, "the queued create to start")
        live.append(queued)
        # Above its 16M request, within its 512M limit: nothing stops it.
        ex, out, _, _ = w.exec(live[0], ["sh", "-c", "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x}"])
        assert ex["code"] == 0 and out.strip() == b"100000000", (ex, out)
        for sid in live:
            w.destroy(sid)
        # The same allocation past a 64M limit is OOM-killed.
        small = w.create(memory="64M", memory_request="16M")["id"]
        ex, out, _, _ = w.exec(small, ["sh", "-c", "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x}"])
        assert ex["code"] == 137 and out == b"", (ex, out)
        w.destroy(small)
        # Requests equal to the node's memory: one at a time.
        big = w.create(memory="256M")["id"]
        r = w.http.post("/v1/sandboxes", params={"wait": "false"}, json={"image": "busybox:latest"})
        assert r.status_code == 202 and r.json()["state"] == "queued", r.text
        w.destroy(big)
        wait_for(lambda: get(w, r.json()["id"])["state"] == "running", 10, "the queued create to start")
        w.destroy(r.json()["id"])


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


@pytest.mark.serial  # the host's MemAvailable
def test_memory_pressure_stops_the_sandbox_furthest_above_its_request(images):
    # The floor sits 500M under what the host has free now, so the 1.5G
    # that one sandbox takes beyond its 32M request crosses it.
    floor = mem_available() - 500 * MIB
    with own_daemon(images, ["--memory-floor", str(floor)]) as w:
        # Within its request (16M, idle): never chosen.
        calm = w.create()["id"]
        # Its request is its limit: it can never be above its request.
        sized = w.create(memory="128M")["id"]
        hog = w.create(
            memory="4G",
            memory_request="32M",
            reclaim="keep",
            cmd=["sh", "-c", "x=$(head -c 1500000000 /dev/zero | tr '\\0' a); sleep 1000"],
        )["id"]
        try:
            row = wait_for(lambda: (s := get(w, hog))["state"] in ("destroyed", "kept", "failed") and s, 60, "the hog to be stopped")
        except AssertionError:
            print(get(w, hog), mem_available(), floor)
            print((w.home / "warren-up.log").read_text()[-4000:])
            raise
        # Kept or not by its policy, it must go: a frozen sandbox keeps its memory.
        assert row["state"] == "destroyed" and row["reason"] == "memory_pressure", row
        # Why, in its log: its use, its request and the host's memory.
        assert "used the most above its memory request" in w.cli("logs", hog).stdout.decode()
        for sid in (calm, sized):
            assert get(w, sid)["state"] == "running"
        # The pressure is gone: creates are admitted again.
        wait_for(lambda: not w.http.get("/v1/nodes").json()[0]["load"]["memory_pressure"], 10, "the pressure to end")
        sid = w.create()["id"]
        for s in (sid, calm, sized):
            w.destroy(s)
