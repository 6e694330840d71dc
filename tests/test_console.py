"""The web console (/ui/, docs/dashboard.md) in Debian's Chromium, headless,
driven by Playwright for Python (its own browsers are never downloaded:
`executable_path` is the system Chromium). Each browser test saves a
screenshot under its temp dir; the main ones are in docs/images/.

Also the console's security: the token never in a URL or a page, the
session cookie's flags, and cookie-authenticated requests from another
site refused (a POST and a WebSocket)."""

import json
import re
import secrets
import shutil
import time

import httpx
import pytest

from helpers import WebSocket

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Console:
    """One logged-in browser page on the console, recording every URL it
    asked for."""

    def __init__(self, browser, warren, tmp_path):
        self.warren = warren
        self.tmp_path = tmp_path
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.urls = []
        self.errors = []
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: d.accept())

    def login(self, token=None):
        self.page.goto(self.warren.url + "/ui/")
        self.page.wait_for_selector("#token", state="visible")
        self.page.fill("#token", token or self.warren.token)
        self.page.click("#login-form button")
        self.page.wait_for_selector("#top", state="visible")
        return self

    def go(self, hash_):
        self.page.evaluate("h => { location.hash = h; }", hash_)

    def shot(self, name, full_page=False):
        path = self.tmp_path / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def terminal_text(self):
        return self.page.evaluate(
            """() => { const b = window.__warrenTerm.buffer.active; const out = [];
               for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
               return out.join('\\n'); }"""
        )

    def wait_terminal(self, pattern, timeout=20):
        deadline = time.time() + timeout
        text = ""
        while time.time() < deadline:
            text = self.terminal_text()
            if re.search(pattern, text, re.M):
                return text
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} never showed in the terminal:\n{text}")

    def close(self):
        self.context.close()


@pytest.fixture
def console(browser, warren, tmp_path):
    c = Console(browser, warren, tmp_path)
    yield c
    c.close()
    assert not c.errors, c.errors


def wait_until(fn, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def rows(page):
    """The sandbox table's rendered rows: [(id, state, labels)]."""
    return page.evaluate(
        """() => [...document.querySelectorAll('#sandbox-table .row')].map(r =>
             [r.dataset.id, r.children[1].textContent, r.children[2].textContent])"""
    )


def batch(warren, task, count, **spec):
    spec.setdefault("image", "busybox:latest")
    spec.setdefault("cpu_request", "5m")
    spec.setdefault("memory", "32M")
    r = warren.http.post("/v1/batches", json={"count": count, "labels": {"task": task}, "spec": spec})
    assert r.status_code in (200, 201, 202), r.text
    return r.json()["id"]


def delete_label(warren, sel):
    warren.http.delete("/v1/sandboxes", params={"label": sel})


def test_batch_appears_and_changes_state_live_and_filters_by_label(console, warren):
    console.login()
    # Marked once: a reload would lose it.
    console.page.evaluate("() => { window.notReloaded = true; }")
    console.go("#/sandboxes")
    console.page.wait_for_selector("#sandbox-table")
    a, b = f"ui-a-{secrets.token_hex(3)}", f"ui-b-{secrets.token_hex(3)}"
    try:
        batch(warren, a, 4)
        batch(warren, b, 3)
        console.page.fill("#filter-label", f"task={a}")
        got = wait_until(lambda: [r for r in rows(console.page) if r[1] == "running"] if len(
            [r for r in rows(console.page) if r[1] == "running"]) == 4 else None, what="4 running rows of batch a")
        assert all(f"task={a}" in r[2] for r in got), got
        assert not any(f"task={b}" in r[2] for r in rows(console.page))
        console.shot("sandboxes")
        # A state change made elsewhere shows without a reload.
        victim = got[0][0]
        assert warren.http.post(f"/v1/sandboxes/{victim}/pause").status_code == 200
        wait_until(lambda: any(r[0] == victim and r[1] == "paused" for r in rows(console.page)),
                   what="the pause to show")
        console.page.fill("#filter-label", f"task={b}")
        wait_until(lambda: len(rows(console.page)) == 3 and all(f"task={b}" in r[2] for r in rows(console.page)),
                   what="batch b alone")
        # The API's set syntax too.
        console.page.fill("#filter-label", f"task in ({a}, {b})")
        wait_until(lambda: len(rows(console.page)) == 7, what="both batches")
        console.page.fill("#filter-label", f"task in ({a}, {b}),task notin ({a})")
        wait_until(lambda: len(rows(console.page)) == 3, what="batch b through in and notin")
        assert console.page.evaluate("() => window.notReloaded") is True
        # The batches view: progress and counts by state.
        console.go("#/batches")
        console.page.wait_for_selector("[data-batch]")
        console.shot("batches")
    finally:
        delete_label(warren, f"task={a}")
        delete_label(warren, f"task={b}")


def test_a_tenants_console_shows_its_own_world_only(console, warren):
    name = f"ui-{secrets.token_hex(3)}"
    token = warren.cli("tenant", "create", name).stdout.decode().strip()
    mine = httpx.post(f"{warren.url}/v1/sandboxes", headers={"Authorization": f"Bearer {token}"},
                      json={"image": "busybox:latest", "labels": {"task": name}}, timeout=60).json()["id"]
    theirs = warren.create(labels={"task": name})["id"]
    try:
        console.login(token)
        assert console.page.text_content("#whoami") == f"{name} (admin)"
        assert console.page.is_hidden("#nav a[href='#/nodes']")
        console.go("#/sandboxes")
        console.page.fill("#filter-label", f"task={name}")
        got = wait_until(lambda: rows(console.page) or None, what="the tenant's sandbox")
        assert [r[0] for r in got] == [mine], got
        time.sleep(2.5)  # one more poll: still its own only
        assert [r[0] for r in rows(console.page)] == [mine]
        assert not any("/v1/nodes" in u for u in console.urls)
        # Its images are the shared ones and its own; prewarming is not its.
        console.go("#/images")
        console.page.wait_for_selector("td:text('busybox:latest')")
        assert console.page.query_selector("#prewarm-ref") is None
    finally:
        warren.destroy(theirs)
        warren.destroy(mine)
        warren.cli("tenant", "rm", name)


def test_the_tenants_view_shows_use_against_quota(console, warren):
    name = f"ui-q-{secrets.token_hex(3)}"
    token = warren.cli("tenant", "create", name, "--sandboxes", "4", "--weight", "2").stdout.decode().strip()
    sid = httpx.post(f"{warren.url}/v1/sandboxes", headers={"Authorization": f"Bearer {token}"},
                     json={"image": "busybox:latest"}, timeout=60).json()["id"]
    try:
        console.login()
        console.go("#/tenants")
        row = console.page.wait_for_selector(f"[data-tenant='{name}']")
        cells = row.eval_on_selector_all("td", "tds => tds.map(t => t.textContent)")
        assert cells[1] == "2" and cells[6].endswith("1 / 4"), cells
        width = row.eval_on_selector(".bar > span", "s => s.style.width")
        assert width == "25%", width
        console.shot("tenants")
    finally:
        warren.destroy(sid)
        warren.cli("tenant", "rm", name)


def test_fleet_matrix_and_drill_down(console, warren):
    task = f"ui-fleet-{secrets.token_hex(3)}"
    try:
        batch(warren, task, 3)
        console.login()
        console.go("#/fleet")
        console.page.wait_for_selector("#fleet-key")
        console.page.select_option("#fleet-key", "task")
        sel = f'td.cell[data-value="{task}"][data-state="running"]'
        console.page.wait_for_selector(sel, timeout=20000)
        # The cell shows up with the batch's first running sandbox; the
        # other two may still be starting (the suite runs side by side).
        # Each redraw replaces the cell, so it is looked up every time.
        wait_until(lambda: console.page.eval_on_selector(f"{sel} .n", "e => e.textContent") == "3",
                   what="all three of the batch running in the cell")
        # The row's CPU bar: the three requests of 5m (what it uses moves).
        bar = console.page.wait_for_selector(f'tr[data-group="{task}"] td[data-col="cpu"] .ubar')
        assert bar.get_attribute("data-request") == "15", bar.get_attribute("data-request")
        console.shot("fleet")
        console.page.click(sel)
        console.page.wait_for_selector("#sandbox-table")
        assert console.page.input_value("#filter-label") == f"task={task}"
        wait_until(lambda: len(rows(console.page)) == 3, what="the cell's three sandboxes")
    finally:
        delete_label(warren, f"task={task}")


def test_overview_shows_nodes_counts_and_events(console, warren, sandbox):
    box = sandbox(labels={"task": "ui-overview"})
    # GET /v1/usage: the sandbox with its usage, and where the event stream
    # starts (at or after its last event).
    def sampled():
        u = warren.http.get("/v1/usage").json()
        r = next(r for r in u["sandboxes"] if r["id"] == box["id"])
        return (u, r) if r.get("memory_bytes") else None

    u, row = wait_until(sampled, timeout=15, what="a usage sample")
    assert row["state"] == "running" and row["labels"]["task"] == "ui-overview"
    assert row["cpu_request_millis"] > 0 and row["memory_request"] > 0 and "cpu_usage_ns" in row
    evs = warren.http.get("/v1/events", params={"sandbox": box["id"]}).json()
    assert u["event_seq"] >= evs[-1]["seq"]
    only = warren.http.get("/v1/usage", params={"label": "task=ui-overview"}).json()["sandboxes"]
    assert [r["id"] for r in only] == [box["id"]]
    assert warren.http.get("/v1/usage").status_code == 200
    assert httpx.get(warren.url + "/v1/usage").status_code == 401
    assert warren.http.get("/v1/usage", params={"state": "bogus"}).status_code == 400
    console.login()
    console.page.wait_for_selector("[data-node]")
    console.page.wait_for_selector("#live-count")
    wait_until(lambda: int(console.page.text_content("#live-count")) >= 1, what="a live count")
    assert "CPU busy" in console.page.text_content("[data-node]")
    # Its events are among the recent ones (from before the page's stream).
    wait_until(lambda: box["id"] in console.page.text_content("main"), what="its events on the Overview")
    console.shot("overview")


def test_sandbox_chart_moves_and_terminal_echoes(console, warren, sandbox):
    box = sandbox(cmd=["sh", "-c", "while :; do :; done"], cpu="300m", labels={"task": "ui-busy"})
    console.login()
    console.go(f"#/sandbox/{box['id']}")
    canvas = console.page.wait_for_selector("#usage-chart")
    # The isolation class it runs in, as the API records it.
    shown = "() => [...document.querySelectorAll('.kv .k')].filter(k => k.textContent === 'isolation')" \
        ".map(k => k.nextElementSibling.textContent)[0]"
    wait_until(lambda: console.page.evaluate(shown) == box["spec"]["isolation"], what="the isolation field")
    first = int(canvas.get_attribute("data-draws") or 0)
    wait_until(lambda: int(canvas.get_attribute("data-draws") or 0) >= first + 4, what="the chart to redraw")
    # The CPU series climbs to the busy loop's rate (limited to 300m).
    wait_until(lambda: float((canvas.get_attribute("data-last") or "0").split(",")[0] or 0) > 50,
               what="CPU above 50m on the chart")
    # Its axes have values: CPU on the left, memory (in powers of two) on
    # the right, the last two minutes below.
    axis = json.loads(canvas.get_attribute("data-axis"))
    assert axis["left"][0] == "0m" and axis["right"][0] == "0 B", axis
    assert axis["right"][-1].endswith(("KiB", "MiB")) and axis["x"] == ["-2 min", "-1 min", "now"], axis
    console.page.click("#open-terminal")
    console.wait_terminal(r"[#$] $")
    console.page.click("#terminal")
    console.page.keyboard.type("echo hi")
    console.page.keyboard.press("Enter")
    console.wait_terminal(r"^hi\s*$")
    console.shot("sandbox")
    # The window's size follows the page's (xterm.js fit, then a resize
    # message on the WebSocket).
    console.page.keyboard.type("stty size")
    console.page.keyboard.press("Enter")
    before = re.findall(r"^(\d+) (\d+)\s*$", console.wait_terminal(r"^\d+ \d+\s*$"), re.M)[-1]
    console.page.set_viewport_size({"width": 900, "height": 900})

    def resized():
        # Asked again each time: the resize may land after a `stty size`.
        console.page.keyboard.type("clear; stty size")
        console.page.keyboard.press("Enter")
        time.sleep(0.3)
        sizes = re.findall(r"^(\d+) (\d+)\s*$", console.terminal_text(), re.M)
        return sizes and sizes[-1] != before and sizes[-1]

    after = wait_until(resized, timeout=15, what="a new window size")
    assert int(after[1]) < int(before[1]), (before, after)


def test_oom_killed_kept_sandbox_terminal_shows_its_files(console, warren):
    # Kept after an OOM kill: it wrote its scene, then ran out of memory.
    r = warren.http.post("/v1/sandboxes", json={
        "image": "busybox:latest", "reclaim": "keep_on_failure", "memory": "32M", "labels": {"task": "ui-kept"},
        "cmd": ["sh", "-c", "echo scene > /tmp/scene-left-behind.txt; x=$(head -c 200000000 /dev/zero | tr '\\0' a)"]})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        kept = wait_until(lambda: (lambda s: s if s["state"] == "kept" else None)(
            warren.http.get(f"/v1/sandboxes/{sid}").json()), what="kept")
        assert kept["reason"] == "oom_killed", kept
        console.login()
        console.go(f"#/sandbox/{sid}")
        console.page.wait_for_selector("#timeline")
        console.page.click("#open-terminal")
        console.wait_terminal(r"[#$] $")
        console.page.click("#terminal")
        console.page.keyboard.type("ls /tmp; cat /tmp/scene-left-behind.txt")
        console.page.keyboard.press("Enter")
        text = console.wait_terminal(r"^scene\s*$")
        assert "scene-left-behind.txt" in text
        console.shot("kept")
        # Still kept once the terminal has gone (the node froze it again).
        console.go("#/")
        assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "kept"
    finally:
        warren.http.delete(f"/v1/sandboxes/{sid}")


def test_buttons_pause_resume_extend_and_delete(console, warren):
    box = warren.create(labels={"task": "ui-delete"}, ttl="10m")
    info = lambda: warren.http.get(f"/v1/sandboxes/{box['id']}").json()  # noqa: E731
    console.login()
    console.go(f"#/sandbox/{box['id']}")
    console.page.click('button[data-action="Pause"]')
    wait_until(lambda: info()["state"] == "paused", what="paused")
    console.page.click('button[data-action="Resume"]')
    wait_until(lambda: info()["state"] == "running", what="running again")
    console.page.click('button[data-action="Extend TTL 1h"]')
    wait_until(lambda: info()["ttl_remaining_ms"] > 30 * 60_000, what="the TTL extended")
    console.page.click('button[data-action="Keep when it ends"]')
    wait_until(lambda: info()["spec"]["reclaim"] == "keep", what="the reclaim policy set to keep")
    console.page.click('button[data-action="Destroy"]')
    wait_until(lambda: warren.http.get(f"/v1/sandboxes/{box['id']}").json()["state"] == "destroyed",
               what="the sandbox destroyed")


def test_logout_is_refused_afterwards(console, warren):
    console.login()
    cookie = next(c for c in console.context.cookies() if c["name"] == "warren_session")
    console.page.click("#logout")
    console.page.wait_for_selector("#login", state="visible")
    status = console.page.evaluate("() => fetch('/v1/usage', {headers: {'X-Warren-Console': '1'}}).then(r => r.status)")
    assert status == 401
    # The old session id is dead on the server, not only in this browser.
    r = httpx.get(warren.url + "/v1/usage", cookies={"warren_session": cookie["value"]})
    assert r.status_code == 401


def test_no_token_in_any_url_page_or_storage(console, warren):
    console.login()
    for view in ["#/", "#/fleet", "#/sandboxes", "#/batches", "#/profiles", "#/images", "#/nodes"]:
        console.go(view)
        console.page.wait_for_timeout(300)
        assert warren.token not in console.page.content()
    assert not any(warren.token in u for u in console.urls), console.urls
    stored = console.page.evaluate(
        "() => JSON.stringify([document.cookie, {...localStorage}, {...sessionStorage}, location.href])")
    assert warren.token not in stored
    assert "warren_session" not in console.page.evaluate("() => document.cookie")  # HttpOnly
    for c in console.context.cookies():
        assert warren.token not in c["value"]
    for asset in ["", "app.js", "views.js", "lib.js", "index.html"]:
        assert warren.token not in httpx.get(f"{warren.url}/ui/{asset}").text


def login_cookie(warren):
    r = httpx.post(warren.url + "/ui/login", json={"token": warren.token},
                   headers={"Origin": warren.url})
    assert r.status_code == 204, r.text
    return r.headers["set-cookie"], r.cookies["warren_session"]


def test_cookie_flags(console, warren):
    header, value = login_cookie(warren)
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/" in header
    assert "Secure" not in header  # plain http here; --public-url https://… adds it
    assert warren.token not in header and len(value) == 64
    console.login()
    c = next(c for c in console.context.cookies() if c["name"] == "warren_session")
    assert c["httpOnly"] is True and c["sameSite"] == "Strict"
    # A wrong token opens no session.
    r = httpx.post(warren.url + "/ui/login", json={"token": "nope"}, headers={"Origin": warren.url})
    assert r.status_code == 401 and "set-cookie" not in r.headers


def test_cross_site_post_with_the_cookie_is_refused(warren):
    _, session = login_cookie(warren)
    jar = {"warren_session": session}
    spec = {"image": "busybox:latest", "labels": {"task": "ui-csrf"}}
    # Another site's form or script: its Origin, the cookie only.
    r = httpx.post(warren.url + "/v1/sandboxes", json=spec, cookies=jar, headers={"Origin": EVIL})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    # No Origin and not the console's header: refused too.
    r = httpx.post(warren.url + "/v1/sandboxes", json=spec, cookies=jar)
    assert r.status_code == 403, r.text
    r = httpx.delete(warren.url + "/v1/sandboxes", params={"label": "task=ui-csrf"}, cookies=jar,
                     headers={"Origin": EVIL})
    assert r.status_code == 403
    # Logging a browser into a session from elsewhere is refused as well.
    r = httpx.post(warren.url + "/ui/login", json={"token": warren.token}, headers={"Origin": EVIL})
    assert r.status_code == 403
    # Reads with the cookie work (SameSite=Strict keeps other sites from
    # sending it; the same-origin policy from reading the answer).
    assert httpx.get(warren.url + "/v1/usage", cookies=jar).status_code == 200
    # The console itself may: its own Origin.
    r = httpx.post(warren.url + "/v1/sandboxes", json=spec, cookies=jar, headers={"Origin": warren.url})
    assert r.status_code == 201, r.text
    assert httpx.delete(f"{warren.url}/v1/sandboxes/{r.json()['id']}", cookies=jar,
                        headers={"X-Warren-Console": "1"}).status_code == 200


def test_cross_site_websocket_with_the_cookie_is_refused(warren, sandbox):
    box = sandbox()
    _, session = login_cookie(warren)
    path = f"/v1/sandboxes/{box['id']}/exec/ws"
    ws = WebSocket(warren.url, path, headers=[f"Cookie: warren_session={session}", f"Origin: {EVIL}"])
    assert ws.status == 403, (ws.status, ws.body)
    assert json.loads(ws.body)["error"]["code"] == "forbidden"
    ws.sock.close()
    # No Origin at all (a browser always sends one on a WebSocket).
    ws = WebSocket(warren.url, path, headers=[f"Cookie: warren_session={session}", "X-Warren-Console: 1"])
    assert ws.status == 403, ws.status
    ws.sock.close()
    # The console's own origin opens it.
    ws = WebSocket(warren.url, path, headers=[f"Cookie: warren_session={session}", f"Origin: {warren.url}"])
    assert ws.status == 101, (ws.status, ws.body)
    ws.send(json.dumps({"cmd": ["echo", "ok"]}))
    kind, start = ws.recv()
    assert json.loads(start)["type"] == "start"
    ws.sock.close()


# A page a sandbox serves, as an attacker writes it: it tries to drive the
# API with the operator's console session, then records what happened in
# its title. API is the daemon's URL, filled in by the test.
HOSTILE_PAGE = """<!doctype html><title>loading</title><script>
(async () => {
  const out = {};
  const api = 'API';
  try {
    const r = await fetch(api + '/v1/sandboxes', {credentials: 'include', headers: {'X-Warren-Console': '1'}});
    out.list = r.status;
  } catch (e) { out.list = 'blocked'; }
  try {
    await fetch(api + '/v1/sandboxes', {method: 'POST', mode: 'no-cors', credentials: 'include',
      headers: {'Content-Type': 'text/plain', 'X-Warren-Console': '1'},
      body: JSON.stringify({image: 'busybox:latest', labels: {task: 'ui-hostile'}})});
    out.create = 'sent';
  } catch (e) { out.create = 'blocked'; }
  try {
    const r = await fetch('/v1/sandboxes', {credentials: 'include', headers: {'X-Warren-Console': '1'}});
    out.own = r.status;
  } catch (e) { out.own = 'blocked'; }
  out.env = await (await fetch('/cgi-bin/env', {credentials: 'include'})).text();
  out.cookies = document.cookie;
  document.title = 'done ' + JSON.stringify(out);
})();
</script>"""

CGI_ENV = "#!/bin/sh\necho 'Content-Type: text/plain'\necho\necho \"cookie=$HTTP_COOKIE\"\n"


def test_a_sandbox_page_opens_on_its_own_origin_and_cannot_use_the_console(console, warren, sandbox):
    """Issue 38 (1): a sandbox's web page never runs on the console's
    origin. Through the API's route a browser with a console session gets
    403 (the old code served the page there and its script listed, ran and
    created as the operator); the console's Open button opens it on its own
    origin (PORT-ID.localhost on the ports listener), where the session is
    useless and no Warren credential reaches the sandbox's server."""
    box = sandbox(cmd=["sh", "-c", "mkdir -p /www/cgi-bin && exec httpd -f -p 8000 -h /www"], labels={"task": "ui-ports"})
    sid = box["id"]
    for path, body in [("/www/index.html", HOSTILE_PAGE.replace("API", warren.url)), ("/www/cgi-bin/env", CGI_ENV)]:
        r = warren.http.put(f"/v1/sandboxes/{sid}/files", params={"path": path, "mode": "0755"}, content=body.encode())
        assert r.status_code in (200, 201, 204), r.text
    wait_until(lambda: warren.http.get(f"/v1/sandboxes/{sid}/ports/8000/").status_code == 200, what="httpd")
    # The token still reaches it through the API, marked as no page to run.
    r = warren.http.get(f"/v1/sandboxes/{sid}/ports/8000/cgi-bin/env", headers={"Cookie": "warren_session=s; app=1"})
    assert r.status_code == 200 and r.headers["content-security-policy"] == "sandbox", r.headers
    assert r.text.strip() == "cookie=app=1", r.text
    before = {s["id"] for s in warren.http.get("/v1/sandboxes").json()}
    console.login()
    r = console.page.goto(f"{warren.url}/v1/sandboxes/{sid}/ports/8000/index.html")
    assert r.status == 403 and "own origin" in r.text(), r.text()
    assert console.page.title() != "loading" and "done" not in console.page.title()
    console.page.goto(f"{warren.url}/ui/#/sandbox/{sid}")
    console.page.wait_for_selector("#open-port")
    with console.context.expect_page() as opened:
        console.page.click("#open-port")
    page = opened.value
    wait_until(lambda: page.title().startswith("done "), what="the sandbox page's script")
    result = json.loads(page.title()[len("done "):])
    host = f"8000-{sid}.localhost"
    assert page.url.startswith(f"http://{host}:") and page.url.endswith("/"), page.url
    assert "warren_port_token" not in page.url
    assert result["list"] == "blocked", result
    assert result["own"] == 404, result  # its own origin is the sandbox's server
    assert result["env"].strip() == "cookie=", result
    assert result["cookies"] == "", result
    after = {s["id"] for s in warren.http.get("/v1/sandboxes").json()}
    assert after == before, after - before
    # Another sandbox's port on the same listener: the cookie opens only its own.
    other = sandbox(cmd=["httpd", "-f", "-p", "8000", "-h", "/"])
    door = page.url.split("/")[2].split(":")[1]
    r = page.goto(f"http://8000-{other['id']}.localhost:{door}/")
    assert r.status == 401 and "through a link" in r.text(), r.status
    page.close()
