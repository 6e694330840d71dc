"""The console as a training dashboard (issue 44; docs/dashboard.md) on a
daemon of its own, so every count is known: the Fleet view over a window
(GET /v1/fleet: every state and outcome, success rate, used / request /
limit, throttling, totals and unlabelled rows), the Overview's history
(GET /v1/history: node CPU heat with the alert line, alert events, queue
length and create latency over time, charts with axis values) and a
batch's totals and cost, each checked in Chromium against the API."""

import secrets

import httpx
import pytest
import warren as warren_sdk

from conftest import own_daemon
from helpers import error_body, wait_until
from test_console import Console, browser  # noqa: F401 (a fixture)

OOM = "x=$(head -c 200000000 /dev/zero | tr '\\0' a)"
ENDED = ("destroyed", "failed", "lost", "preempted")


@pytest.fixture(scope="module")
def dash(images):
    """A daemon with sandboxes that ended each its own way: task=fit
    succeeded and failed (exit 3), task=oom OOM-killed (32M) beside a
    running one, and one running without the label."""
    with own_daemon(images) as w:
        made = {}

        def make(name, **spec):
            r = w.http.post("/v1/sandboxes", json={"image": "busybox:latest", **spec})
            assert r.status_code == 201, r.text
            made[name] = r.json()["id"]

        make("ok", labels={"task": "fit"}, cmd=["sh", "-c", "exit 0"])
        make("exit3", labels={"task": "fit"}, cmd=["sh", "-c", "exit 3"])
        make("oom", labels={"task": "oom"}, memory="32M", cmd=["sh", "-c", OOM])
        make("live", labels={"task": "oom"}, memory="64M")
        make("bare")
        for name in ("ok", "exit3", "oom"):
            wait_until(lambda: w.http.get(f"/v1/sandboxes/{made[name]}").json()["state"] in ENDED,
                       timeout=30, what=f"sandbox {name} to end")
        w.made = made
        yield w


def fleet(w, **q):
    r = w.http.get("/v1/fleet", params={"key": "task", "since": "1h", **q})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_fleet_counts_every_outcome_with_totals_and_unlabelled(dash):
    f = fleet(dash)
    assert f["columns"] == ["queued", "creating", "running", "paused", "stopping", "kept",
                            "succeeded", "failed", "oom_killed", "lost", "preempted"]
    groups = {g["value"]: g for g in f["groups"]}
    assert set(groups) == {"fit", "oom"}
    fit, oom = groups["fit"], groups["oom"]
    assert fit["counts"] == {"succeeded": 1, "failed": 1}
    assert (fit["ended"], fit["succeeded"], fit["success_rate"]) == (2, 1, 0.5)
    assert oom["counts"] == {"oom_killed": 1, "running": 1}
    assert (oom["ended"], oom["succeeded"], oom["success_rate"]) == (1, 0, 0.0)
    # The OOM-killed one reached its limit; the limits are what was asked.
    assert oom["memory"]["limit_bytes"] == (32 + 64) * 2**20
    assert oom["memory"]["used_bytes"] >= 30 * 2**20
    assert f["unlabelled"]["counts"] == {"running": 1} and "success_rate" not in f["unlabelled"]
    total = f["total"]
    assert total["sandboxes"] == 5 and total["ended"] == 3 and total["succeeded"] == 1
    assert total["cpu"]["limit_millis"] == sum(g["cpu"]["limit_millis"] for g in (fit, oom, f["unlabelled"]))
    assert 0 <= total["throttled"] <= 1 and total["cpu_periods"] >= total["cpu_throttled_periods"]
    assert total["cpu_seconds"] > 0


def test_fleet_and_history_refuse_bad_input(dash):
    for q, said in [({"key": "task", "since": "0s"}, "longer than zero"),
                    ({"key": "task", "since": "31d"}, "at most 30d"),
                    ({"key": "task", "since": "soon"}, "15m, 1h"),
                    ({"key": "no such key!"}, "invalid label key"),
                    ({"since": "1h"}, "key is required")]:
        r = dash.http.get("/v1/fleet", params=q)
        assert r.status_code == 400 and said in error_body(r)["message"], (q, r.text)
    r = dash.http.get("/v1/history", params={"since": "2h"})
    assert r.status_code == 400 and "at most 1h" in error_body(r)["message"], r.text


def test_a_tenant_sees_its_own_fleet_and_no_history(dash):
    name = f"dash-{secrets.token_hex(3)}"
    token = dash.cli("tenant", "create", name).stdout.decode().strip()
    http = httpx.Client(base_url=dash.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    r = http.post("/v1/sandboxes", json={"image": "busybox:latest", "labels": {"task": "fit"},
                                         "cmd": ["sh", "-c", "exit 0"]})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    wait_until(lambda: http.get(f"/v1/sandboxes/{sid}").json()["state"] in ENDED, timeout=30, what="its end")
    mine = http.get("/v1/fleet", params={"key": "task"}).json()
    assert [(g["value"], g["counts"]) for g in mine["groups"]] == [("fit", {"succeeded": 1})]
    assert mine["total"]["sandboxes"] == 1
    # The operator counts it among everyone's.
    assert {g["value"]: g for g in fleet(dash)["groups"]}["fit"]["counts"]["succeeded"] == 2
    assert http.get("/v1/history").status_code == 403


def test_the_fleet_view_shows_what_the_api_answers(browser, dash, tmp_path):  # noqa: F811
    c = Console(browser, dash, tmp_path).login()
    try:
        c.go("#/fleet?key=task&since=1h")
        c.page.wait_for_selector("[data-loaded='task|1h']")
        api = fleet(dash)
        cells = c.page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#fleet-matrix tr[data-group]')]
            .map(tr => [tr.dataset.group, Object.fromEntries([...tr.querySelectorAll('td[data-col]')].map(td => {
                const bar = td.querySelector('.ubar');
                return [td.dataset.col, bar ? [+bar.dataset.used, +bar.dataset.request, +bar.dataset.limit]
                                            : td.firstChild ? td.firstChild.textContent : ''];
            }))]))""")
        rows = {g["value"]: g for g in api["groups"]}
        rows["(unlabelled)"] = api["unlabelled"]
        rows["total"] = api["total"]
        assert set(cells) == set(rows), cells
        for name, g in rows.items():
            shown = cells[name]
            for col in api["columns"]:
                assert shown[col] == (str(g["counts"][col]) if col in g["counts"] else "·"), (name, col, shown)
            rate = g.get("success_rate")
            assert shown["success"] == ("–" if rate is None else f"{round(rate * 100)}%"), (name, shown)
            # Requests and limits are fixed; use moves while a sandbox runs,
            # so it is compared where every member has ended.
            assert shown["cpu"][1:] == [g["cpu"]["request_millis"], g["cpu"]["limit_millis"]], (name, shown)
            assert shown["memory"][1:] == [g["memory"]["request_bytes"], g["memory"]["limit_bytes"]], (name, shown)
        assert cells["fit"]["memory"][0] == rows["fit"]["memory"]["used_bytes"]
        assert cells["fit"]["cpu"][0] == rows["fit"]["cpu"]["used_millis"]
        c.shot("fleet", full_page=True)
        # Another window is another question to the API.
        c.page.select_option("#fleet-window", "15m")
        c.page.wait_for_selector("[data-loaded='task|15m']")
        assert "since=15m" in c.page.url
        # A live count lists its sandboxes.
        c.page.click('#fleet-matrix tr[data-group="oom"] td[data-col="running"]')
        c.page.wait_for_selector("#sandbox-table")
        assert c.page.input_value("#filter-label") == "task=oom"
    finally:
        c.close()
    assert not c.errors, c.errors


def test_the_overview_charts_the_history_with_axes_and_alerts(browser, dash, tmp_path):  # noqa: F811
    # Two samples at least, one after the creates and the OOM kill.
    hist = wait_until(lambda: (lambda h: h if len(h["points"]) >= 2 and h["alerts"] else None)(
        dash.http.get("/v1/history", params={"since": "15m"}).json()), timeout=30, what="two samples and an alert")
    assert hist["interval_ms"] == 5000 and hist["kept_ms"] == 3_600_000
    assert any(a["reason"] == "oom_killed" and a["sandbox_id"] == dash.made["oom"] for a in hist["alerts"])
    timed = [p for p in hist["points"] if p["creates"]]
    assert timed and all(0 < p["create_p50_ms"] <= p["create_p99_ms"] for p in timed), hist["points"]
    node = next(iter(hist["points"][-1]["node_cpu"]))
    assert all(0 <= p["node_cpu"][node] <= 1 for p in hist["points"])
    c = Console(browser, dash, tmp_path).login()
    try:
        heat = c.page.wait_for_selector("#node-heat[data-rows]")
        assert heat.get_attribute("data-rows") == node
        c.page.wait_for_selector(f"#alert-events tr[data-reason='oom_killed'] a[href='#/sandbox/{dash.made['oom']}']")
        axis = lambda sel: __import__("json").loads(c.page.get_attribute(sel, "data-axis"))  # noqa: E731
        cpu = axis("#node-cpu-chart")
        assert cpu["left"] == ["0%", "25%", "50%", "75%", "100%"] and len(cpu["x"]) == 3
        lat = axis("#latency-chart")
        assert lat["left"][0] == "0 ms" and all(t.endswith(" ms") for t in lat["left"])
        assert float(lat["left"][-1].split()[0]) >= max(p["create_p99_ms"] for p in timed)
        assert len(axis("#queue-chart")["x"]) == 3
        assert ":" in axis("#node-heat")["x"][0]
        c.shot("overview", full_page=True)
    finally:
        c.close()
    assert not c.errors, c.errors


def test_a_batch_page_shows_its_totals_and_cost(browser, dash, tmp_path):  # noqa: F811
    # Issue 44's target: a finished batch of 50 shows non-zero CPU-seconds
    # and its success count, in the CLI, the SDK and the console.
    r = dash.http.post("/v1/batches", json={"count": 50, "labels": {"task": "batch"}, "spec": {
        "image": "busybox:latest", "cpu_request": "5m", "memory": "32M",
        "cmd": ["sh", "-c", "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done"]}})
    assert r.status_code in (200, 201, 202), r.text
    bid = r.json()["id"]
    b = wait_until(lambda: (lambda b: b if sum(b["states"].get(s, 0) for s in ENDED) == 50 else None)(
        dash.http.get(f"/v1/batches/{bid}").json()), timeout=120, interval=0.5, what="the batch to finish")
    assert b["succeeded"] == 50 and b["cost"]["cpu_seconds"] > 0 and b["cost"]["gpu_seconds"] == 0
    header, *rows = dash.cli("batch", "ls").stdout.decode().splitlines()
    row = next(r.split() for r in rows if r.startswith(bid))
    assert row[3:6] == ["50", "0", f"{b['cost']['cpu_seconds']:.3f}"], (header, row)
    with warren_sdk.Client(dash.url, token=dash.token) as client:
        info = client.batches.get(bid).info
    assert (info.succeeded, info.cost.cpu_seconds) == (50, b["cost"]["cpu_seconds"]), info
    c = Console(browser, dash, tmp_path).login()
    try:
        c.go(f"#/batch/{bid}")
        c.page.wait_for_selector(f"[data-cost='{bid}']")
        shown = c.page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('[data-total]')]
            .map(e => [e.dataset.total, e.querySelector('.big').textContent]))""")
        assert shown == {
            "succeeded": "50",
            "cpu_seconds": f"{b['cost']['cpu_seconds']:.2f}",
            "memory_gb_seconds": f"{b['cost']['memory_gb_seconds']:.3f}",
            "gpu_seconds": "0.0",
        }, (shown, b)
        c.shot("batch", full_page=True)
    finally:
        c.close()
    assert not c.errors, c.errors


def test_an_ended_sandboxs_page_charts_its_kept_usage(browser, dash, tmp_path):  # noqa: F811
    """The usage history the control plane kept (a sample every 15 s, the
    first at once) and the usage it ended with, on its page."""
    r = dash.http.post("/v1/sandboxes", json={"image": "busybox:latest", "cmd": [
        "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 2"]})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    wait_until(lambda: dash.http.get(f"/v1/sandboxes/{sid}").json()["state"] in ENDED, timeout=60,
               what="the sandbox to end")
    wait_until(lambda: dash.http.get(f"/v1/sandboxes/{sid}/logs", params={"usage": "true"}).text.strip(),
               what="a kept usage sample")
    c = Console(browser, dash, tmp_path).login()
    try:
        c.go(f"#/sandbox/{sid}")
        chart = c.page.wait_for_selector("#usage-history[data-draws]")
        # The CPU it used between its first sample and its end, as a rate.
        wait_until(lambda: float((chart.get_attribute("data-last") or "0").split(",")[0] or 0) > 0,
                   what="a CPU rate on the life chart")
        axis = __import__("json").loads(chart.get_attribute("data-axis"))
        assert axis["left"][0] == "0m" and axis["right"][0] == "0 B" and len(axis["x"]) == 3, axis
    finally:
        c.close()
    assert not c.errors, c.errors


def test_a_restart_reads_the_last_hours_alerts_back(dash):
    """Last in this file: it restarts the module's daemon. The samples
    start afresh; the alerts are events of the store's log, read back."""
    def oom_alerts():
        h = dash.http.get("/v1/history", params={"since": "1h"}).json()
        return [a["seq"] for a in h["alerts"] if a["sandbox_id"] == dash.made["oom"]]

    before = wait_until(oom_alerts, timeout=30, what="the OOM kill's alert")
    dash.stop()
    dash.start()
    assert wait_until(oom_alerts, timeout=30, what="the alert read back after the restart") == before
