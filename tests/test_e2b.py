"""E2B's protocols on Warren (`warren up --e2b-api --e2b-sandbox`), driven
by the real E2B SDK from PyPI, pinned, each version in its own cached venv,
running unchanged user code (tests/e2b_client.py) with only E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY set."""

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from conftest import Warren, free_port
from debian import CACHE, cache_lock, debian_archive
from helpers import sh_ok, wait_until

IMAGE = "e2b-deb:1"
# The Debian image with a stand-in for E2B's code-interpreter server.
INTERPRETER_IMAGE = "e2b-ci:1"
# E2B's `base`: the Debian image with bash, git, sudo and the user `user`.
USER_IMAGE = "e2b-user:1"
INTERPRETER = "e2b-code-interpreter==2.11.5"
CLIENT = Path(__file__).parent / "e2b_client.py"
# The newest, the last with the v1 create route, the oldest that sends the
# routing headers on connect.
VERSIONS = ["2.63.0", "2.50.0", "2.26.0"]
NPM_VERSION = "2.51.0"


def venv(version, package=None):
    """A venv with `e2b==version` (or `package`), made once and cached (a
    marker says it was made whole)."""
    package = package or f"e2b=={version}"
    d = CACHE / "venvs" / package.replace("==", "-")
    with cache_lock(f"venv-{d.name}"):
        if not (d / "complete").exists():
            shutil.rmtree(d, ignore_errors=True)
            subprocess.run(["python3", "-m", "venv", d], check=True)
            got = subprocess.run([d / "bin" / "pip", "install", "-q", "--disable-pip-version-check",
                                  package], capture_output=True, text=True)
            assert got.returncode == 0, f"pip install {package}: {got.stderr[-2000:]}"
            (d / "complete").write_text(package)
    return d / "bin" / "python"


def npm_e2b():
    """node_modules with npm `e2b@NPM_VERSION`, installed once and cached."""
    d = CACHE / "npm" / f"e2b-{NPM_VERSION}"
    with cache_lock(f"npm-{d.name}"):
        if not (d / "complete").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            (d / "package.json").write_text('{"private": true, "type": "module"}\n')
            got = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", f"e2b@{NPM_VERSION}"],
                                 cwd=d, capture_output=True, text=True, timeout=600)
            assert got.returncode == 0, f"npm install e2b@{NPM_VERSION}: {got.stderr[-2000:]}"
            (d / "complete").write_text(NPM_VERSION)
    return d


@pytest.fixture(scope="module")
def e2b_warren(tmp_path_factory):
    base = Path(tempfile.mkdtemp(prefix="warren-e2b-"))
    api, sbx = free_port(), free_port()
    w = Warren(base / "home", free_port(),
               extra_args=["--e2b-api", f"127.0.0.1:{api}", "--e2b-sandbox", f"127.0.0.1:{sbx}"])
    w.home.mkdir()
    # `base`, the SDK's default template, is the Debian image here; the
    # code interpreter's default template starts its server in each sandbox.
    (w.home / "e2b-templates.toml").write_text(
        f'[templates]\nbase = "{IMAGE}"\n\n'
        f'[templates.code-interpreter-v1]\nimage = "{INTERPRETER_IMAGE}"\n'
        'cmd = ["python3", "/opt/e2b/interpreter.py"]\nready_port = 49999\n\n'
        f'[templates.dead-server]\nimage = "{IMAGE}"\ncmd = ["python3", "-c", "raise SystemExit(3)"]\n'
        'ready_port = 49999\n')
    w.start()
    try:
        w.cli("image", "import", str(debian_archive(tmp_path_factory.mktemp("deb"))), "--name", IMAGE, timeout=300)
        # The interpreter image: the stand-in server committed into the
        # Debian image, as a template build would bake it in.
        s = w.http.post("/v1/sandboxes", json={"image": IMAGE}).json()
        stub = (Path(__file__).parent / "e2b_interpreter_stub.py").read_bytes()
        r = w.http.put(f"/v1/sandboxes/{s['id']}/files", params={"path": "/opt/e2b/interpreter.py"}, content=stub)
        assert r.status_code in (200, 201, 204), r.text
        r = w.http.post(f"/v1/sandboxes/{s['id']}/commit", json={"name": INTERPRETER_IMAGE}, timeout=120)
        assert r.status_code in (200, 201), r.text
        w.http.delete(f"/v1/sandboxes/{s['id']}")
        w.e2b_env = {
            "E2B_API_URL": f"http://127.0.0.1:{api}",
            "E2B_SANDBOX_URL": f"http://127.0.0.1:{sbx}",
            "E2B_API_KEY": "e2b_" + w.token,
        }
        yield w
    finally:
        w.stop_and_remove(base)


def run_client(w, version, flavour, template="base"):
    return run_script(w, venv(version), [CLIENT, flavour, template], f"e2b {version} ({flavour})")


def run_script(w, python, argv, what):
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(w.e2b_env)
    p = subprocess.run([python, *argv], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{what} failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p.stdout


@pytest.mark.parametrize("version", VERSIONS)
def test_the_e2b_sdk_runs_unchanged(e2b_warren, version):
    out = run_client(e2b_warren, version, "sync")
    assert "sync ok" in out
    # Nothing is left of the killed sandboxes.
    live = [s for s in e2b_warren.http.get("/v1/sandboxes", params={"label": "warren.dev/front=e2b"}).json()
            if s["state"] not in ("destroyed", "failed")]
    assert live == [], live


def test_the_async_e2b_sdk_runs_unchanged(e2b_warren):
    assert "async ok" in run_client(e2b_warren, VERSIONS[0], "async")


@pytest.mark.parametrize("version", VERSIONS)
def test_e2b_ptys_are_warren_terminals(e2b_warren, version):
    # sbx.pty: output, input, resize (stty size), a second reader
    # (connect), exit codes, ^D, kill; sync and async.
    out = run_client(e2b_warren, version, "pty")
    assert "sync pty ok" in out and "\npty ok" in out, out


def test_e2b_watch_dir_reports_filesystem_events(e2b_warren):
    # files.watch_dir: the polled watcher (sync: CreateWatcher,
    # GetWatcherEvents, RemoveWatcher) and the WatchDir stream (async):
    # create/write/rename/chmod/remove with the right names, stop, a
    # missing directory refused, recursive watches.
    out = run_client(e2b_warren, VERSIONS[0], "watch")
    assert "sync watch ok" in out and "async watch ok" in out, out


def test_the_api_watch_route_streams_directory_events(e2b_warren):
    w = e2b_warren
    s = w.http.post("/v1/sandboxes", json={"image": IMAGE}).json()
    try:
        sid = s["id"]
        r = w.http.get(f"/v1/sandboxes/{sid}/watch", params={"path": "/no/such"})
        assert r.status_code == 404, r.text
        r = w.http.post(f"/v1/sandboxes/{sid}/paths", json={"op": "make_dir", "path": "/w"})
        assert r.status_code in (200, 201), r.text
        with w.http.stream("GET", f"/v1/sandboxes/{sid}/watch", params={"path": "/w"}, timeout=30) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("application/x-ndjson")
            r = w.http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/w/a.txt"}, content=b"hi")
            assert r.status_code in (200, 201, 204), r.text
            seen = []
            for line in resp.iter_lines():
                if line.strip():
                    ev = json.loads(line)
                    assert ev["type"] == "event", ev
                    seen.append((ev["kind"], ev["name"]))
                if ("write", "a.txt") in seen:
                    break
            assert seen[:2] == [("create", "a.txt"), ("write", "a.txt")], seen
    finally:
        w.http.delete(f"/v1/sandboxes/{s['id']}")


@pytest.mark.parametrize("version", VERSIONS[1:])
def test_older_e2b_sdks_watch_dirs(e2b_warren, version):
    assert "sync watch ok" in run_client(e2b_warren, version, "watch-sync")


def test_the_js_sdk_runs_unchanged_under_node_and_watches(e2b_warren):
    d = npm_e2b()
    script = d / "client.mjs"
    shutil.copy(Path(__file__).parent / "e2b_client.mjs", script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(e2b_warren.e2b_env)
    p = subprocess.run(["node", script], cwd=d, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "node ok" in p.stdout, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"


def test_the_code_interpreter_sdk_runs_against_a_template_that_starts_its_server(e2b_warren):
    out = run_script(e2b_warren, venv(None, INTERPRETER), [Path(__file__).parent / "e2b_interpreter_client.py"],
                     INTERPRETER)
    assert "interpreter ok" in out


def test_a_template_whose_server_exits_fails_the_create_and_leaves_nothing(e2b_warren):
    api = e2b_warren.e2b_env["E2B_API_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    before = {s["id"] for s in e2b_warren.http.get("/v1/sandboxes").json()}
    r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "dead-server"}, headers=key, timeout=90)
    assert r.status_code == 500, r.text
    message = r.json()["message"]
    assert "port 49999" in message and "exited" in message and "warren logs" in message, message
    after = [s for s in e2b_warren.http.get("/v1/sandboxes", params={"all": "true"}).json()
             if s["id"] not in before]
    assert after and all(s["state"] not in ("running", "creating", "queued") for s in after), after


def test_the_e2b_sdk_builds_a_template_and_starts_sandboxes_from_it(e2b_warren, tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('app')\n")
    out = run_script(e2b_warren, venv(VERSIONS[0]), [Path(__file__).parent / "e2b_template_client.py", IMAGE, str(tmp_path)],
                     "e2b template build")
    assert out.strip().endswith("ok"), out
    # Its build's sandboxes are gone; the image is Warren's, under the template's name.
    live = [s for s in e2b_warren.http.get("/v1/sandboxes").json()
            if s["state"] in ("running", "creating") and "warren.dev/build" in s["spec"]["labels"]]
    assert live == [], live
    names = {i["name"] for i in e2b_warren.http.get("/v1/images").json()}
    assert any(n.startswith("e2b-template/tpl-") for n in names), names
    # The template with a start command keeps a warm pool of sandboxes
    # running it; the client's create took one (the build waited for it).
    pools = [p for p in e2b_warren.http.get("/v1/pools").json() if p["name"].startswith("e2b-tpl-")]
    assert [p["spec"]["cmd"] for p in pools] == [["/bin/sh", "-c", "python3 -m http.server 8000"]], pools
    # Pinned to the build's digest, under the template's name (what a
    # cluster's nodes pull from its registry).
    assert pools[0]["claimed"] >= 1 and pools[0]["spec"]["image"].startswith("e2b-template/tpl-"), pools
    assert "@sha256:" in pools[0]["spec"]["image"], pools
    e2b_warren.http.delete(f"/v1/pools/{pools[0]['name']}")


def test_forks_and_snapshots_through_the_e2b_sdk(e2b_warren):
    out = run_script(e2b_warren, venv(VERSIONS[0]), [Path(__file__).parent / "e2b_snapshot_client.py", IMAGE],
                     "e2b forks and snapshots")
    assert out.strip().endswith("snapshots ok"), out
    # The deleted snapshot's image went with it.
    names = {i["name"] for i in e2b_warren.http.get("/v1/images").json()}
    assert not any(n.startswith("e2b-snapshot/") for n in names), names


def test_a_template_may_be_an_image_reference(e2b_warren):
    # No alias: the templateID is the image itself.
    assert "async ok" in run_client(e2b_warren, VERSIONS[0], "async", template=IMAGE)


def test_the_api_key_is_warrens_token_and_errors_say_what_to_do(e2b_warren):
    api = e2b_warren.e2b_env["E2B_API_URL"]
    r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": "e2b_00"})
    assert r.status_code == 401 and "Warren's API token" in r.json()["message"], r.text
    key = {"X-API-KEY": e2b_warren.token}
    r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "no-such-image:1"}, headers=key, timeout=60)
    assert r.status_code == 404 and "e2b-templates.toml" in r.json()["message"], r.text
    r = httpx.post(f"{api}/v2/sandboxes", content=b"{not json", headers=key)
    assert r.status_code == 400 and r.json()["code"] == 400, r.text
    r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base", "metadata": {"k": "has space"}}, headers=key)
    assert r.status_code == 400 and "label" in r.json()["message"], r.text
    assert e2b_warren.http.get("/v1/sandboxes").json() == [] or all(
        s["state"] in ("destroyed", "failed") for s in e2b_warren.http.get("/v1/sandboxes").json())


def test_envd_needs_the_sandboxs_token_and_unknown_sandboxes_are_not_found(e2b_warren):
    api, sbx_url = e2b_warren.e2b_env["E2B_API_URL"], e2b_warren.e2b_env["E2B_SANDBOX_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    s = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base"}, headers=key, timeout=60).json()
    try:
        h = {"E2b-Sandbox-Id": s["sandboxID"], "E2b-Sandbox-Port": "49983"}
        assert httpx.get(f"{sbx_url}/health", headers=h).status_code == 204
        r = httpx.post(f"{sbx_url}/filesystem.Filesystem/Stat", json={"path": "/"}, headers=h)
        assert r.status_code == 401, r.text
        r = httpx.post(f"{sbx_url}/filesystem.Filesystem/Stat", json={"path": "/"},
                       headers={**h, "X-Access-Token": s["envdAccessToken"]})
        assert r.status_code == 200 and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY", r.text
        # Old SDKs send only the token: it names the sandbox.
        r = httpx.post(f"{sbx_url}/filesystem.Filesystem/Stat", json={"path": "/etc"},
                       headers={"X-Access-Token": s["envdAccessToken"]})
        assert r.status_code == 200, r.text
        # A token of another sandbox is refused.
        other = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base"}, headers=key, timeout=60).json()
        r = httpx.post(f"{sbx_url}/filesystem.Filesystem/Stat", json={"path": "/"},
                       headers={**h, "X-Access-Token": other["envdAccessToken"]})
        assert r.status_code == 401, r.text
        httpx.delete(f"{api}/sandboxes/{other['sandboxID']}", headers=key)
    finally:
        assert httpx.delete(f"{api}/sandboxes/{s['sandboxID']}", headers=key).status_code == 204
    r = httpx.get(f"{sbx_url}/health", headers={"E2b-Sandbox-Id": s["sandboxID"]})
    assert r.status_code == 502 and "was not found" in r.json()["message"], r.text
    assert httpx.get(f"{api}/sandboxes/{s['sandboxID']}", headers=key).status_code == 404


def test_a_port_needs_an_e2b_sandbox_and_its_token_and_gets_no_credentials(e2b_warren):
    """Issue 38 (6): knowing a sandbox's id is not enough to reach its
    servers; a sandbox not made through E2B is not reachable through this
    door at all; what reaches the server carries no credential."""
    api, sbx_url = e2b_warren.e2b_env["E2B_API_URL"], e2b_warren.e2b_env["E2B_SANDBOX_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    # The server answers with the request's headers (lower-cased names).
    echo = ("import http.server,json\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(s):\n"
            "        b=json.dumps({k.lower():v for k,v in s.headers.items()}).encode()\n"
            "        s.send_response(200); s.end_headers(); s.wfile.write(b)\n"
            "http.server.HTTPServer(('127.0.0.1',8000),H).serve_forever()\n")
    s = httpx.post(f"{api}/sandboxes", json={"templateID": "base"}, headers=key, timeout=60).json()
    plain = e2b_warren.http.post("/v1/sandboxes", json={"image": IMAGE, "cmd": ["python3", "-c", echo]}).json()
    try:
        assert s["trafficAccessToken"] and s["trafficAccessToken"] != s["envdAccessToken"]
        r = e2b_warren.http.put(f"/v1/sandboxes/{s['sandboxID']}/files", params={"path": "/tmp/echo.py"},
                                content=echo.encode())
        assert r.status_code in (200, 201, 204), r.text
        sh_ok(e2b_warren, s["sandboxID"], "setsid python3 /tmp/echo.py >/dev/null 2>&1 &")

        def get(sid, **extra):
            h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000", "Authorization": "Bearer " + e2b_warren.token,
                 "Cookie": "warren_session=x", **extra}
            return httpx.get(f"{sbx_url}/", headers=h, timeout=10)

        ok = wait_until(lambda: (lambda r: r if r.status_code == 200 else None)(
            get(s["sandboxID"], **{"E2B-Traffic-Access-Token": s["trafficAccessToken"]})), what="server up")
        seen = ok.json()
        assert not {"authorization", "cookie", "e2b-traffic-access-token", "x-access-token"} & set(seen), seen
        r = get(s["sandboxID"], **{"X-Access-Token": s["envdAccessToken"]})
        assert r.status_code == 200, r.text
        r = get(s["sandboxID"])
        assert r.status_code == 403 and "Traffic-Access-Token" in r.text, r.text
        other = httpx.post(f"{api}/sandboxes", json={"templateID": "base"}, headers=key, timeout=60).json()
        r = get(s["sandboxID"], **{"E2B-Traffic-Access-Token": other["trafficAccessToken"]})
        assert r.status_code == 403, r.text
        httpx.delete(f"{api}/sandboxes/{other['sandboxID']}", headers=key)
        # A sandbox made through Warren's own API: its server answers
        # there, and never through E2B's door, whatever token is shown.
        wait_until(lambda: e2b_warren.http.get(f"/v1/sandboxes/{plain['id']}/ports/8000/").status_code == 200,
                   what="plain server up")
        c = httpx.post(f"{api}/v2/sandboxes/{plain['id']}/connect", json={"timeout": 60}, headers=key).json()
        for extra in ({}, {"X-Access-Token": c["envdAccessToken"]},
                      {"E2B-Traffic-Access-Token": c["trafficAccessToken"]}):
            r = get(plain["id"], **extra)
            assert r.status_code == 403, r.text
    finally:
        httpx.delete(f"{api}/sandboxes/{s['sandboxID']}", headers=key)
        e2b_warren.http.delete(f"/v1/sandboxes/{plain['id']}")


def test_a_signed_file_url_acts_as_the_user_it_was_signed_for(e2b_warren):
    """Issue 38 (8): a URL signed for the default user reads as that user,
    whatever user an `Authorization` header then names."""
    import base64
    import hashlib

    api, sbx_url = e2b_warren.e2b_env["E2B_API_URL"], e2b_warren.e2b_env["E2B_SANDBOX_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    s = httpx.post(f"{api}/sandboxes", json={"templateID": "base"}, headers=key, timeout=60).json()
    try:
        sh_ok(e2b_warren, s["sandboxID"], "mkdir -p /home/user && echo root > /root/f && echo user > /home/user/f")
        # The SDK's own signature (e2b/sandbox/signature.py): default user.
        raw = f"f:read::{s['envdAccessToken']}"
        sig = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")
        h = {"E2b-Sandbox-Id": s["sandboxID"], "E2b-Sandbox-Port": "49983"}
        r = httpx.get(f"{sbx_url}/files", params={"path": "f", "signature": sig}, headers=h)
        assert (r.status_code, r.text) == (200, "root\n"), r.text
        as_user = {**h, "Authorization": "Basic " + base64.b64encode(b"user:").decode()}
        r = httpx.get(f"{sbx_url}/files", params={"path": "f", "signature": sig}, headers=as_user)
        assert (r.status_code, r.text) == (200, "root\n"), r.text
        # With the token, the header names the user, as envd does.
        r = httpx.get(f"{sbx_url}/files", params={"path": "f"}, headers={**as_user, "X-Access-Token": s["envdAccessToken"]})
        assert (r.status_code, r.text) == (200, "user\n"), r.text
    finally:
        httpx.delete(f"{api}/sandboxes/{s['sandboxID']}", headers=key)


def test_lists_connect_and_metrics_as_e2b_answers(e2b_warren):
    """Issue 40 (5): a list is newest first unless `order=asc`, filtered by
    `startedAfter` and `template` and paged; a connect only ever extends a
    sandbox's life; metrics honour their time range."""
    import datetime

    api = e2b_warren.e2b_env["E2B_API_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    tag = secrets.token_hex(3)
    make = lambda template: httpx.post(f"{api}/sandboxes", headers=key, timeout=60, json={
        "templateID": template, "timeout": 300, "metadata": {"t": tag}}).json()["sandboxID"]
    first = make("base")
    time.sleep(1.1)
    between = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    time.sleep(1.1)
    second = make(IMAGE)
    ids = [first, second]
    try:
        listed = lambda **p: [x["sandboxID"] for x in httpx.get(
            f"{api}/v2/sandboxes", headers=key, params={"metadata": f"t={tag}", **p}).json()]
        assert listed() == [second, first]
        assert listed(order="asc") == [first, second]
        assert listed(startedAfter=between.isoformat()) == [second]
        assert listed(startedAfter=between.replace(tzinfo=None).isoformat()) == [second]
        assert listed(template="base") == [first]
        r = httpx.get(f"{api}/v2/sandboxes", headers=key, params={"metadata": f"t={tag}", "limit": 1})
        assert [x["sandboxID"] for x in r.json()] == [second] and r.headers["x-next-token"] == second
        assert listed(limit=1, nextToken=second) == [first]
        assert httpx.get(f"{api}/v2/sandboxes", headers=key, params={"order": "sideways"}).status_code == 400
        # Connect with a shorter timeout keeps the longer life; a longer one extends it.
        left = lambda: e2b_warren.http.get(f"/v1/sandboxes/{first}").json()["ttl_remaining_ms"]
        assert httpx.post(f"{api}/v2/sandboxes/{first}/connect", json={"timeout": 10}, headers=key).status_code == 200
        assert left() > 200_000, left()
        httpx.post(f"{api}/v2/sandboxes/{first}/connect", json={"timeout": 900}, headers=key)
        assert left() > 800_000, left()
        now = int(time.time())
        m = lambda **p: httpx.get(f"{api}/sandboxes/{first}/metrics", headers=key, params=p).json()
        assert len(m()) == 1 and len(m(start=now - 60, end=now + 60)) == 1
        assert m(start=now + 3600) == [] and m(end=now - 3600) == []
    finally:
        for sid in ids:
            httpx.delete(f"{api}/sandboxes/{sid}", headers=key)


def test_commands_and_files_act_as_the_templates_user(e2b_warren, tmp_path):
    """Issue 40 (1): in an image with E2B's `user` (as E2B's templates),
    commands run as that user, in its home, with HOME/USER/LOGNAME from
    /etc/passwd, and relative paths are its home; a user named by the call
    gets its own. (An image without `user` keeps root: every other test
    here.)"""
    w = e2b_warren
    # E2B's `base` made offline by scripts/make-base-image.sh --e2b-user.
    w.cli("image", "import", str(debian_archive(tmp_path, e2b_user=True)), "--name", USER_IMAGE, timeout=300)
    out = run_script(w, venv(VERSIONS[0]), [Path(__file__).parent / "e2b_user_client.py", USER_IMAGE],
                     "e2b user client")
    assert "user ok" in out


def test_signed_file_urls_work_without_the_sandbox_header(e2b_warren):
    """Issue 40 (4): `download_url`/`upload_url` are opened by whatever holds
    them (a browser, curl), with no E2B header: the signature names the
    sandbox; it stays bound to path, operation, user and expiry."""
    import base64
    import hashlib

    api, sbx_url = e2b_warren.e2b_env["E2B_API_URL"], e2b_warren.e2b_env["E2B_SANDBOX_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    s = httpx.post(f"{api}/sandboxes", json={"templateID": "base"}, headers=key, timeout=60).json()

    def sign(path, op, exp=None):
        raw = f"{path}:{op}::{s['envdAccessToken']}" + (f":{exp}" if exp else "")
        return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")

    try:
        exp = int(time.time()) + 60
        up = {"path": "/tmp/signed.txt", "signature": sign("/tmp/signed.txt", "write", exp), "signature_expiration": exp}
        r = httpx.post(f"{sbx_url}/files", params=up, content=b"via url",
                       headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200, r.text
        down = {"path": "/tmp/signed.txt", "signature": sign("/tmp/signed.txt", "read")}
        r = httpx.get(f"{sbx_url}/files", params=down)
        assert (r.status_code, r.content) == (200, b"via url"), r.text
        # The read signature does not write, nor read another path; an
        # expired one is refused.
        assert httpx.post(f"{sbx_url}/files", params=down, content=b"x").status_code == 401
        assert httpx.get(f"{sbx_url}/files", params={**down, "path": "/etc/passwd"}).status_code == 401
        old = int(time.time()) - 1
        r = httpx.get(f"{sbx_url}/files", params={"path": "/tmp/signed.txt", "signature_expiration": old,
                                                   "signature": sign("/tmp/signed.txt", "read", old)})
        assert r.status_code == 401, r.text
    finally:
        httpx.delete(f"{api}/sandboxes/{s['sandboxID']}", headers=key)


def test_allow_out_makes_an_allowlist_sandbox(e2b_warren):
    """Issue 40 (7): E2B's allowOut switches the sandbox to allowlist mode
    (a host for ports 80 and 443, HOST:PORT as given; ALL_TRAFFIC in
    denyOut is what allowlist mode does anyway) instead of a 400; a deny
    list alone is refused with what to send."""
    api = e2b_warren.e2b_env["E2B_API_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    r = httpx.post(f"{api}/sandboxes", headers=key, timeout=60, json={
        "templateID": "base", "network": {"allowOut": ["pypi.org", "10.1.2.3:8080"], "denyOut": ["0.0.0.0/0"]}})
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    try:
        net = e2b_warren.http.get(f"/v1/sandboxes/{sid}").json()["spec"]["network"]
        assert net["mode"] == "allowlist" and net["allow"] == ["pypi.org:80", "pypi.org:443", "10.1.2.3:8080"], net
        # updateNetwork replaces the rules of an allowlist sandbox.
        r = httpx.put(f"{api}/sandboxes/{sid}/network", headers=key, json={"allowOut": ["files.pythonhosted.org"]})
        assert r.status_code == 204, r.text
        net = e2b_warren.http.get(f"/v1/sandboxes/{sid}").json()["spec"]["network"]
        assert net["allow"] == ["files.pythonhosted.org:80", "files.pythonhosted.org:443"], net
    finally:
        httpx.delete(f"{api}/sandboxes/{sid}", headers=key)
    # One made without allowOut reaches nothing and stays so.
    plain = httpx.post(f"{api}/sandboxes", headers=key, timeout=60, json={"templateID": "base"}).json()["sandboxID"]
    try:
        r = httpx.put(f"{api}/sandboxes/{plain}/network", headers=key, json={"allowOut": ["pypi.org"]})
        assert r.status_code == 409, r.text
    finally:
        httpx.delete(f"{api}/sandboxes/{plain}", headers=key)
    r = httpx.post(f"{api}/sandboxes", headers=key, json={"templateID": "base", "network": {"denyOut": ["evil.example"]}})
    assert r.status_code == 400 and "allowOut" in r.json()["message"], r.text


def test_pause_and_connect_resume(e2b_warren):
    api, sbx_url = e2b_warren.e2b_env["E2B_API_URL"], e2b_warren.e2b_env["E2B_SANDBOX_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    s = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base"}, headers=key, timeout=60).json()
    sid = s["sandboxID"]
    try:
        assert httpx.post(f"{api}/sandboxes/{sid}/pause", headers=key).status_code == 204
        assert httpx.post(f"{api}/sandboxes/{sid}/pause", headers=key).status_code == 409
        assert httpx.get(f"{api}/sandboxes/{sid}", headers=key).json()["state"] == "paused"
        paused = httpx.get(f"{api}/v2/sandboxes", params={"state": "paused"}, headers=key).json()
        assert [x["sandboxID"] for x in paused] == [sid]
        r = httpx.post(f"{api}/v2/sandboxes/{sid}/connect", json={"timeout": 60}, headers=key)
        assert r.status_code == 201 and r.json()["sandboxID"] == sid, r.text
        r = httpx.post(f"{api}/v2/sandboxes/{sid}/connect", json={}, headers=key)
        assert r.status_code == 200
        m = httpx.get(f"{api}/sandboxes/{sid}/metrics", headers=key).json()
        assert isinstance(m, list)
    finally:
        httpx.delete(f"{api}/sandboxes/{sid}", headers=key)
    # on_timeout: pause. At its timeout the sandbox pauses, memory and all,
    # and a connect carries on where it was.
    r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base", "timeout": 2, "autoPause": True},
                   headers=key, timeout=60)
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    try:
        warren_sid = e2b_warren.http.get(f"/v1/sandboxes/{sid}").json()
        assert warren_sid["spec"]["reclaim"] == "pause"
        e2b_warren.exec(sid, ["sh", "-c", "echo kept > /tmp/state"])
        wait_until(lambda: httpx.get(f"{api}/sandboxes/{sid}", headers=key).json().get("state") == "paused",
                   timeout=15, what="the timeout's pause")
        detail = httpx.get(f"{api}/sandboxes/{sid}", headers=key).json()
        assert detail["lifecycle"]["onTimeout"] == "pause", detail
        r = httpx.post(f"{api}/sandboxes/{sid}/connect", json={"timeout": 60}, headers=key)
        assert r.status_code == 201, r.text
        assert e2b_warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        ev, out, _, _ = e2b_warren.exec(sid, ["cat", "/tmp/state"])
        assert out == b"kept\n", out
    finally:
        httpx.delete(f"{api}/sandboxes/{sid}", headers=key)
    r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base", "autoPause": True, "autoPauseMemory": False},
                   headers=key, timeout=60)
    assert r.status_code == 400 and "filesystem" in r.json()["message"], r.text
    r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base", "autoResume": {"enabled": True}},
                   headers=key, timeout=60)
    assert r.status_code == 400 and "autoPause" in r.json()["message"], r.text
    # autoResume: paused at its timeout, the sandbox is resumed by the next
    # call that reaches it (here envd's file read), with its timeout again.
    r = httpx.post(f"{api}/v2/sandboxes", headers=key, timeout=60,
                   json={"templateID": "base", "timeout": 2, "autoPause": True, "autoResume": {"enabled": True}})
    assert r.status_code == 201, r.text
    s = r.json()
    sid = s["sandboxID"]
    try:
        e2b_warren.exec(sid, ["sh", "-c", "echo woke > /tmp/state"])
        wait_until(lambda: e2b_warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused",
                   timeout=15, what="the timeout's pause")
        detail = httpx.get(f"{api}/sandboxes/{sid}", headers=key).json()
        assert detail["lifecycle"] == {"autoResume": True, "onTimeout": "pause"} and detail["metadata"] == {}, detail
        r = httpx.get(f"{sbx_url}/files", params={"path": "/tmp/state", "username": "root"},
                      headers={"E2b-Sandbox-Id": sid, "X-Access-Token": s["envdAccessToken"]}, timeout=30)
        assert (r.status_code, r.text) == (200, "woke\n"), r.text
        info = e2b_warren.http.get(f"/v1/sandboxes/{sid}").json()
        assert info["state"] == "running" and info["ttl_remaining_ms"] > 0, info
    finally:
        httpx.delete(f"{api}/sandboxes/{sid}", headers=key)


def test_timeouts_longer_than_warren_keeps_a_sandbox_are_refused_and_change_nothing(e2b_warren):
    """A TTL the store or the clock cannot hold is E2B's 400 at every door
    (create, set timeout, connect) and a Connect deadline beyond any Warren
    keeps is `invalid_argument`: nothing is created, no TTL moves, no task
    panics (the duration type itself refuses them)."""
    api, sbx_url = e2b_warren.e2b_env["E2B_API_URL"], e2b_warren.e2b_env["E2B_SANDBOX_URL"]
    key = {"X-API-KEY": e2b_warren.token}
    live = lambda: {s["id"] for s in e2b_warren.http.get("/v1/sandboxes").json() if s["state"] == "running"}
    before = live()
    for t in (365 * 86400 + 1, 2**64 - 1):
        r = httpx.post(f"{api}/sandboxes", json={"templateID": "base", "timeout": t}, headers=key, timeout=60)
        assert r.status_code == 400 and "timeout" in r.json()["message"], r.text
    assert live() == before
    s = httpx.post(f"{api}/sandboxes", json={"templateID": "base", "timeout": 60}, headers=key, timeout=60).json()
    sid = s["sandboxID"]
    try:
        for t in (99999999999, 2**64 - 1):
            r = httpx.post(f"{api}/sandboxes/{sid}/timeout", json={"timeout": t}, headers=key)
            assert r.status_code == 400 and "timeout" in r.json()["message"], r.text
            r = httpx.post(f"{api}/v2/sandboxes/{sid}/connect", json={"timeout": t}, headers=key)
            assert r.status_code == 400, r.text
        info = e2b_warren.http.get(f"/v1/sandboxes/{sid}").json()
        assert info["state"] == "running" and 0 < info["ttl_remaining_ms"] <= 60_000, info
        h = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": s["envdAccessToken"],
             "Content-Type": "application/connect+json", "Connect-Timeout-Ms": str(2**64 - 1)}
        r = httpx.post(f"{sbx_url}/process.Process/Start", content=b"", headers=h)
        assert "invalid_argument" in r.text and "Connect-Timeout-Ms" in r.text, r.text
        assert httpx.get(f"{api}/sandboxes/{sid}", headers=key).status_code == 200
    finally:
        httpx.delete(f"{api}/sandboxes/{sid}", headers=key)


def test_e2b_secrets_and_volumes_through_the_sdk(e2b_warren):
    """E2B's `Secret` and `Volume` classes, unchanged (tests/e2b_volumes_secrets_client.py):
    the secrets API, a secret given as `Secret.fill(name)` in envVars, the
    volumes API, the volume content API (E2B_VOLUME_API_URL: the same
    listener), and a sandbox mounting the volume sharing files with it."""
    w = e2b_warren
    w.e2b_env["E2B_VOLUME_API_URL"] = w.e2b_env["E2B_API_URL"]
    try:
        out = run_script(w, venv(VERSIONS[0]), [Path(__file__).parent / "e2b_volumes_secrets_client.py", "base"],
                         "e2b secrets and volumes")
    finally:
        del w.e2b_env["E2B_VOLUME_API_URL"]
    assert out.strip().endswith("volumes and secrets ok"), out
    # Nothing is left: no secret, no volume, no sandbox.
    assert w.http.get("/v1/secrets").json() == []
    assert w.http.get("/v1/volumes").json() == []


def test_e2b_secrets_and_volumes_refuse_bad_input_clearly(e2b_warren):
    w = e2b_warren
    api = w.e2b_env["E2B_API_URL"]
    key = {"X-API-KEY": w.token}
    running = lambda: {s["id"] for s in w.http.get("/v1/sandboxes").json() if s["state"] == "running"}
    before = running()

    def create(**body):
        r = httpx.post(f"{api}/v2/sandboxes", json={"templateID": "base", **body}, headers=key, timeout=60)
        assert r.status_code >= 400 and r.json()["code"] == r.status_code, r.text
        return r.status_code, r.json()["message"]

    # Egress header transforms are refused, not ignored; secrets fill whole variables.
    rules = {"rules": {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.k}"}}}]}}
    status, msg = create(network=rules)
    assert status == 400 and "network.rules" in msg and "TLS" in msg, msg
    status, msg = create(envVars={"AUTH": "Bearer ${e2b.secrets.k}"})
    assert status == 400 and "whole variable" in msg, msg
    status, msg = create(envVars={"AUTH": "${e2b.secrets.no-such-secret}"})
    assert status == 400 and "no-such-secret" in msg, msg
    # Mounts name existing, lowercase volumes.
    status, msg = create(volumeMounts=[{"name": "missing-vol", "path": "/mnt/x"}])
    assert status == 404 and "Volume.create" in msg, msg
    status, msg = create(volumeMounts=[{"name": "Missing", "path": "/mnt/x"}])
    assert status == 400 and "lowercase" in msg, msg
    assert running() == before

    # Secrets: a page size out of range, a body without a value.
    r = httpx.get(f"{api}/secrets", params={"limit": 0}, headers=key)
    assert r.status_code == 400 and "limit" in r.json()["message"], r.text
    r = httpx.post(f"{api}/secrets", json={"name": "k"}, headers=key)
    assert r.status_code == 400 and r.json()["code"] == 400, r.text
    assert httpx.get(f"{api}/secrets", headers={"X-API-KEY": "e2b_00"}).status_code == 401

    # The content API: its own token, paths inside the volume, sane numbers.
    r = httpx.post(f"{api}/volumes", json={"name": "badinput"}, headers=key)
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    try:
        content = f"{api}/volumecontent/badinput"
        r = httpx.get(f"{content}/path", params={"path": "/"})
        assert r.status_code == 401 and r.json()["code"] == "401", r.text
        r = httpx.get(f"{content}/path", params={"path": "/"}, headers={"X-API-KEY": w.token})
        assert r.status_code == 401, r.text              # the API key is not a volume token
        r = httpx.get(f"{api}/volumecontent/other/path", params={"path": "/"},
                      headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 403, r.text
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.get(f"{content}/path", params={"path": "/"}, headers=auth)
        assert r.status_code == 200 and r.json()["type"] == "directory", r.text
        for params, what in [({"path": "/../etc/passwd"}, ".."), ({}, "path"),
                             ({"path": "/f", "mode": 0o10644}, "mode"), ({"path": "/f", "uid": 70000}, "uid")]:
            r = httpx.put(f"{content}/file", params=params, content=b"x", headers=auth)
            assert r.status_code == 400 and what in r.json()["message"], (params, r.text)
        r = httpx.delete(f"{content}/path", params={"path": "/"}, headers=auth)
        assert r.status_code == 400, r.text
        r = httpx.patch(f"{content}/path", params={"path": "/"}, content=b"{nope", headers=auth)
        assert r.status_code == 400 and "Invalid metadata" in r.json()["message"], r.text
        assert httpx.get(f"{content}/dir", params={"path": "/"}, headers=auth).json() == []
    finally:
        assert httpx.delete(f"{api}/volumes/badinput", headers=key).status_code == 204
    assert httpx.delete(f"{api}/volumes/badinput", headers=key).status_code == 404
    # The token of a volume removed and made again is not the new one's.
    r = httpx.post(f"{api}/volumes", json={"name": "badinput"}, headers=key)
    try:
        assert r.status_code == 201 and r.json()["token"] != token, r.text
        r = httpx.get(f"{api}/volumecontent/badinput/path", params={"path": "/"},
                      headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 403, r.text
    finally:
        httpx.delete(f"{api}/volumes/badinput", headers=key)


def test_the_js_sdk_uses_secrets_and_volumes(e2b_warren):
    d = npm_e2b()
    script = d / "volumes_secrets.mjs"
    shutil.copy(Path(__file__).parent / "e2b_volumes_secrets_client.mjs", script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(e2b_warren.e2b_env, E2B_VOLUME_API_URL=e2b_warren.e2b_env["E2B_API_URL"])
    p = subprocess.run(["node", script], cwd=d, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "node volumes and secrets ok" in p.stdout, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"


def test_sandbox_ports_by_host_public_where_the_operator_allows_and_masked(images):
    """`--e2b-domain`: a request for `PORT-ID.DOMAIN` (E2B's `get_host`)
    reaches that port; with `--e2b-public-traffic`, a sandbox made with
    E2B's default `allowPublicTraffic` takes it without a token, one made
    with `allowPublicTraffic: false` only with its traffic token, and
    `maskRequestHost` is the Host its server sees."""
    from conftest import own_daemon
    api_port, sbx_port = free_port(), free_port()
    args = ["--e2b-api", f"127.0.0.1:{api_port}", "--e2b-sandbox", f"127.0.0.1:{sbx_port}",
            "--e2b-domain", "sbx.test", "--e2b-public-traffic"]
    cgi = "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n%s' \"$HTTP_HOST\"\n"
    with own_daemon(images, args=args) as w:
        api, key = f"http://127.0.0.1:{api_port}", {"X-API-KEY": w.token}

        def make(**network):
            body = {"templateID": "busybox:latest", **({"network": network} if network else {})}
            s = httpx.post(f"{api}/sandboxes", json=body, headers=key, timeout=60).json()
            r = w.http.put(f"/v1/sandboxes/{s['sandboxID']}/files", params={"path": "/www/cgi-bin/host", "mode": "755"},
                           content=cgi.encode())
            assert r.status_code in (200, 201, 204), r.text
            sh_ok(w, s["sandboxID"], "httpd -p 8000 -h /www")
            return s

        def get(s, **headers):
            return httpx.get(f"http://127.0.0.1:{sbx_port}/cgi-bin/host", timeout=10,
                             headers={"Host": f"8000-{s['sandboxID']}.sbx.test", **headers})

        public = make()
        private = make(allowPublicTraffic=False, maskRequestHost="localhost:${PORT}")
        assert public["domain"] == "sbx.test"
        r = wait_until(lambda: (lambda r: r if r.status_code == 200 else None)(get(public)), what="httpd up")
        assert r.text == f"8000-{public['sandboxID']}.sbx.test", r.text
        r = get(private)
        assert r.status_code == 403 and "Traffic-Access-Token" in r.text, r.text
        r = get(private, **{"E2B-Traffic-Access-Token": public["trafficAccessToken"]})
        assert r.status_code == 403, r.text
        r = get(private, **{"E2B-Traffic-Access-Token": private["trafficAccessToken"]})
        assert (r.status_code, r.text) == (200, "localhost:8000"), r.text
        # envd by host still needs the access token; a host of another
        # domain routes nothing.
        r = httpx.get(f"http://127.0.0.1:{sbx_port}/files", params={"path": "/www/cgi-bin/host"},
                      headers={"Host": f"49983-{public['sandboxID']}.sbx.test"})
        assert r.status_code == 401, r.text
        r = httpx.get(f"http://127.0.0.1:{sbx_port}/", headers={"Host": f"8000-{public['sandboxID']}.other.test"})
        assert r.status_code == 400, r.text
        r = httpx.post(f"{api}/sandboxes", json={"templateID": "busybox:latest", "network": {"maskRequestHost": "a b"}},
                       headers=key)
        assert r.status_code == 400 and "maskRequestHost" in r.text, r.text
        # Both are fixed at create: `updateNetwork` refuses a change.
        for change, what in [({"allowPublicTraffic": True}, "allowPublicTraffic"),
                             ({"maskRequestHost": "example.com"}, "maskRequestHost")]:
            r = httpx.put(f"{api}/sandboxes/{private['sandboxID']}/network", json=change, headers=key)
            assert r.status_code == 409 and f"{what} is fixed at create" in r.text, r.text
        assert get(private, **{"E2B-Traffic-Access-Token": private["trafficAccessToken"]}).text == "localhost:8000"
