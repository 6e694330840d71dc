"""Usage sampling, profiles that learn, the baseline table, and /metrics."""

import tempfile
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import own_daemon

MIB = 1 << 20


def wait_gone(warren, sid, timeout=30):
    deadline = time.time() + timeout
    while True:
        rows = warren.http.get("/v1/sandboxes", params={"all": "true"}).json()
        row = next(r for r in rows if r["id"] == sid)
        if row["state"] in ("destroyed", "failed", "lost", "kept"):
            return row
        assert time.time() < deadline, row
        time.sleep(0.1)


@pytest.mark.serial  # needs a whole free core to read 0.7 of one
def test_sampling_matches_a_known_load(warren, sandbox):
    sid = sandbox(cpu=1, memory="256M")["id"]
    # One core busy for 3 s while 64 MiB are held.
    warren.exec(
        sid,
        ["sh", "-c", "sh -c 'x=$(head -c 67108864 /dev/zero | tr \"\\\\0\" a); sleep 3' & "
         "end=$(( $(date +%s) + 3 )); while [ $(date +%s) -lt $end ]; do :; done; wait"],
        timeout="20s",
    )
    time.sleep(1.2)
    u = warren.http.get(f"/v1/sandboxes/{sid}").json()["usage"]
    assert u["samples"] >= 3, u
    assert 700 <= u["cpu_millis_peak"] <= 1150, u
    assert u["memory_peak_bytes"] >= 64 * MIB, u
    assert u["cpu_periods"] > 0


def test_profile_learns_from_a_batch(warren):
    task = f"learn-{int(time.time() * 1000) % 100000}"
    bid = warren.http.post("/v1/batches", json={
        "count": 3,
        "spec": {"image": "busybox:latest", "cpu": 1, "memory": "256M",
                 "cmd": ["sh", "-c", "x=$(head -c 41943040 /dev/zero | tr '\\0' a); "
                                     "end=$(( $(date +%s) + 2 )); while [ $(date +%s) -lt $end ]; do :; done"]},
        "labels": {"task": task},
    }).json()["id"]
    deadline = time.time() + 60
    while warren.http.get(f"/v1/batches/{bid}").json()["states"].get("destroyed") != 3:
        assert time.time() < deadline
        time.sleep(0.2)
    detail = warren.http.get(f"/v1/profiles/{task}").json()
    assert detail["profile"]["runs"] == 3 and len(detail["runs"]) == 3
    assert detail["profile"]["original"] == {"cpu_millis": 1000, "memory": 256 * MIB}
    peak_cpu = max(r["cpu_millis_peak"] for r in detail["runs"])
    peak_mem = max(r["memory_peak"] for r in detail["runs"])
    assert peak_mem >= 40 * MIB
    rec = detail["recommendation"]
    step_cpu, step_mem = 50, 16 * MIB
    assert rec["cpu_millis"] == -(-int(peak_cpu * 1.5) // step_cpu) * step_cpu or rec["cpu_millis"] >= peak_cpu * 1.5
    assert peak_mem * 1.5 <= rec["memory"] < peak_mem * 1.5 + step_mem
    # The next sandbox of the task, without sizes, gets the recommendation;
    # explicit sizes still win.
    s = warren.create(labels={"task": task})
    assert s["resources"]["cpu_millis"] == detail["profile"]["current"]["cpu_millis"] == rec["cpu_millis"]
    assert s["resources"]["memory"] == detail["profile"]["current"]["memory"] == rec["memory"]
    warren.destroy(s["id"])
    s = warren.create(labels={"task": task}, cpu=0.3, memory="64M")
    assert s["resources"]["cpu_millis"] == 300 and s["resources"]["memory"] == 64 * MIB
    warren.destroy(s["id"])


def test_oom_growth_is_capped_at_twice_and_flags_the_profile(warren):
    name = f"oomer-{int(time.time() * 1000) % 100000}"
    table = f'[profiles.{name}]\ncpu = 0.5\nmemory = "32M"\n'
    assert warren.http.post("/v1/profiles/import", content=table).status_code == 200
    seen = []
    for _ in range(4):
        s = warren.create(profile=name, cmd=["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a)"])
        seen.append(s["resources"]["memory"])
        row = wait_gone(warren, s["id"])
        assert row["reason"] == "oom_killed", row
    assert seen[:3] == [32 * MIB, 48 * MIB, 64 * MIB], seen
    p = warren.http.get(f"/v1/profiles/{name}").json()["profile"]
    assert p["anomalous"] and p["current"]["memory"] == 64 * MIB and "2" in p["anomaly"]
    assert seen[3] == 64 * MIB
    evs = warren.http.get("/v1/events", params={"type": "profile_anomalous"}).json()
    assert any(name in e["message"] for e in evs)
    out = warren.cli("profile", "ls").stdout.decode()
    assert name in out and "ANOMALOUS" in out
    # A person resets it; it starts again from the original request.
    r = warren.http.post(f"/v1/profiles/{name}/reset").json()
    assert not r["anomalous"] and r["current"]["memory"] == 32 * MIB


def test_profile_table_round_trips(warren):
    table = '[profiles.rt-a]\ncpu = 2.5\nmemory = "4G"\n\n[profiles.rt-b]\ncpu = 0.25\nmemory = "512M"\noriginal_cpu = 1.0\noriginal_memory = "1G"\n'
    assert warren.http.post("/v1/profiles/import", content=table).status_code == 200
    exported = warren.cli("profile", "export").stdout.decode()
    assert 'cpu = 2.5' in exported and 'memory = "4G"' in exported
    path = Path(tempfile.mkdtemp()) / "profiles.toml"
    path.write_text(exported)
    warren.http.post("/v1/profiles/rt-a/reset")
    warren.http.post("/v1/profiles/import", content='[profiles.rt-a]\ncpu = 9\nmemory = "9G"\n')
    warren.cli("profile", "import", str(path))
    assert warren.cli("profile", "export").stdout.decode() == exported
    bad = warren.http.post("/v1/profiles/import", content='[profiles.x]\ncpu = -1\nmemory = "1G"\n')
    assert bad.status_code == 400
    assert warren.cli("profile", "export").stdout.decode() == exported


def test_shrinking_frees_capacity_for_queued_work(images):
    with own_daemon(images, ["--max-sandboxes", "3"]) as w:
        total_mem = w.http.get("/v1/nodes").json()[0]["allocatable"]["memory"]
        big = (total_mem // 2 // MIB + 1) * MIB  # two do not fit at once
        w.http.post("/v1/profiles/import", content=f'[profiles.shrink]\ncpu = 0.1\nmemory = "{big}"\n')
        first = w.create(profile="shrink", cmd=["sleep", "1"])
        r = w.http.post("/v1/sandboxes", params={"wait": "false"}, json={"image": "busybox:latest", "profile": "shrink", "cmd": ["true"]})
        assert r.status_code == 202 and r.json()["state"] == "queued"
        wait_gone(w, first["id"])
        wait_gone(w, r.json()["id"])
        # Both runs used a few MiB: the profile shrank, so several now fit at once.
        p = w.http.get("/v1/profiles/shrink").json()["profile"]
        assert p["current"]["memory"] < big // 4, p
        sids = []
        for _ in range(3):
            r = w.http.post("/v1/sandboxes", params={"wait": "false"}, json={"image": "busybox:latest", "profile": "shrink"})
            assert r.status_code == 201 and r.json()["state"] == "running", r.text
            sids.append(r.json()["id"])
        for sid in sids:
            w.destroy(sid)


def test_metrics_parse_and_hold_the_series(warren, sandbox):
    sid = sandbox(cpu=0.5, memory="64M")["id"]
    warren.exec(sid, ["true"])
    text = warren.http.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("warren_node_allocatable", "warren_node_allocated", "warren_sandboxes", "warren_queue_length",
                 "warren_sandbox_create_seconds", "warren_exec_start_seconds", "warren_queue_wait_seconds",
                 "warren_profile_request", "warren_sandbox_cpu_cores", "warren_sandbox_memory_bytes",
                 "warren_node_cpu_busy_ratio"):
        assert name in fams, (name, sorted(fams))
    samples = [s for f in fams.values() for s in f.samples]
    assert any(s.name == "warren_sandbox_memory_bytes" and s.labels.get("sandbox") == sid for s in samples)
    running = next(s for s in samples if s.name == "warren_sandboxes" and s.labels.get("state") == "running")
    assert running.value >= 1
    assert any(s.name == "warren_sandbox_create_seconds_count" and s.value >= 1 for s in samples)
    warren.destroy(sid)
    text = warren.http.get("/metrics").text
    assert f'sandbox="{sid}"' not in text
    assert warren.http.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_batch_retries_an_oom_killed_member_once_with_a_grown_request(warren):
    task = f"retry-{int(time.time() * 1000) % 100000}"
    hog = "x=$(head -c 40000000 /dev/zero | tr '\\0' a); echo ok"
    bid = warren.http.post("/v1/batches", json={
        "count": 1,
        "retry_on_oom": True,
        "spec": {"image": "busybox:latest", "cpu": 0.2, "memory": "32M", "cmd": ["sh", "-c", hog]},
        "labels": {"task": task},
    }).json()["id"]
    deadline = time.time() + 40
    while True:
        ms = warren.http.get("/v1/sandboxes", params={"label": f"warren.dev/batch={bid}", "all": "true"}).json()
        if len(ms) == 2 and all(m["state"] == "destroyed" for m in ms):
            break
        assert time.time() < deadline, ms
        time.sleep(0.2)
    first = next(m for m in ms if "warren.dev/retry-of" not in m["spec"]["labels"])
    retry = next(m for m in ms if "warren.dev/retry-of" in m["spec"]["labels"])
    assert first["reason"] == "oom_killed"
    assert retry["spec"]["labels"]["warren.dev/retry-of"] == first["id"]
    # The profile grew after the OOM kill; the retry got the grown request.
    assert retry["resources"]["memory"] == 48 * MIB, retry["resources"]
    assert retry["reason"] in ("main_exited", "oom_killed")
    # Never a second retry.
    time.sleep(1)
    assert len(warren.http.get("/v1/sandboxes", params={"label": f"warren.dev/batch={bid}", "all": "true"}).json()) == 2


def _simulate(*args):
    import subprocess

    from conftest import WARREN_BENCH

    out = subprocess.run(
        [str(WARREN_BENCH), "simulate", "--sandboxes", "2000", "--tasks", "80", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in ("fixed", "learned", "oracle"):
            rows[cells[0]] = {
                "per_node": float(cells[1]),
                "oom_rate": float(cells[3].rstrip("%")),
                "flagged": float(cells[4].split("(")[1].rstrip("%)")),
            }
    return rows


def test_simulation_meets_the_right_sizing_target_at_node_defaults():
    rows = _simulate()
    fixed, learned, oracle = rows["fixed"], rows["learned"], rows["oracle"]
    assert learned["per_node"] >= 1.5 * fixed["per_node"], rows
    assert learned["oom_rate"] < 0.5, rows
    assert learned["flagged"] < 2.0, rows
    assert oracle["per_node"] >= learned["per_node"], rows


def test_simulation_follows_the_margin():
    # Without CPU overcommit CPU binds, so a lower CPU margin packs more.
    wide = _simulate("--cpu-overcommit", "1")["learned"]["per_node"]
    narrow = _simulate("--cpu-overcommit", "1", "--cpu-margin", "1.25")["learned"]["per_node"]
    assert narrow > wide * 1.1, (wide, narrow)
