"""Tenants (issue 43): each tenant's token reaches its own tenant's things
only, through the API and the E2B door alike; what another tenant owns
answers as what does not exist, and nothing of it changes. Viewers read
and never change; revoked tokens stop at once; tokens are kept hashed."""

import base64
import contextlib
import io
import json
import tarfile

import httpx
import pytest

from conftest import free_port, own_daemon


@pytest.fixture(scope="module")
def tw(images):
    e2b, sbx = free_port(), free_port()
    with own_daemon(images, args=["--e2b-api", f"127.0.0.1:{e2b}", "--e2b-sandbox", f"127.0.0.1:{sbx}"]) as w:
        w.e2b_api = f"http://127.0.0.1:{e2b}"
        w.e2b_sandbox = f"http://127.0.0.1:{sbx}"
        yield w


def new_tenant(w, name, *flags):
    """Makes a tenant; answers its admin token (the CLI prints it once)."""
    out = w.cli("tenant", "create", name, *flags).stdout.decode().strip()
    assert out.startswith("wrt_"), out
    return out


def as_token(w, token):
    return httpx.Client(base_url=w.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


@pytest.fixture(scope="module")
def two(tw):
    """Tenants a and b; a owns a running sandbox, a batch, a pool and a secret."""
    a, b = new_tenant(tw, "team-a"), new_tenant(tw, "team-b")
    ha, hb = as_token(tw, a), as_token(tw, b)
    r = ha.post("/v1/sandboxes", json={"image": "busybox:latest", "name": "a-web", "labels": {"who": "a"}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert r.json()["tenant"] == "team-a"
    r = ha.post("/v1/batches", json={"count": 1, "spec": {"image": "busybox:latest"}})
    assert r.status_code == 202, r.text
    batch = r.json()["id"]
    r = ha.put("/v1/pools/a-pool", json={"image": "busybox:latest", "size": 0})
    assert r.status_code == 200, r.text
    r = ha.post("/v1/secrets", json={"name": "a-key", "value": "v1"})
    assert r.status_code == 201, r.text
    yield {"a": a, "b": b, "ha": ha, "hb": hb, "sid": sid, "batch": batch}
    ha.delete(f"/v1/batches/{batch}")
    ha.delete("/v1/pools/a-pool")
    ha.delete("/v1/secrets/a-key")
    ha.delete(f"/v1/sandboxes/{sid}")


# Every way the API names one sandbox, as (method, path, body): tenant b
# must get 404 from each, and a's sandbox must be as it was.
SANDBOX_VERBS = {
    "inspect": ("GET", "", None),
    "destroy": ("DELETE", "", None),
    "exec": ("POST", "/exec", {"cmd": ["true"]}),
    "exec_ws": ("GET", "/exec/ws", None),
    "stdin": ("POST", "/execs/x/stdin", None),
    "heartbeat": ("POST", "/heartbeat", None),
    "pause": ("POST", "/pause", None),
    "resume": ("POST", "/resume", None),
    "ttl": ("POST", "/ttl", {"ttl": "1s"}),
    "reclaim": ("POST", "/reclaim", {"reclaim": "destroy"}),
    "fork": ("POST", "/fork", {"count": 1}),
    "read_file": ("GET", "/files?path=/etc/hostname", None),
    "write_file": ("PUT", "/files?path=/tmp/x", b"x"),
    "paths": ("POST", "/paths", {"op": "list", "path": "/"}),
    "logs": ("GET", "/logs", None),
    "watch": ("GET", "/watch?path=/tmp", None),
    "network": ("PATCH", "/network", {"mode": "none"}),
    "port_forward": ("POST", "/ports/80", None),
    "port_link": ("GET", "/ports/80", None),
    "port_http": ("GET", "/ports/80/", None),
}


def call(h, method, path, body):
    if isinstance(body, bytes):
        return h.request(method, path, content=body)
    return h.request(method, path, json=body) if body is not None else h.request(method, path)


@pytest.mark.parametrize("verb", sorted(SANDBOX_VERBS))
@pytest.mark.parametrize("by", ["id", "name"])
def test_another_tenants_sandbox_is_not_found_by_any_verb(tw, two, verb, by):
    method, tail, body = SANDBOX_VERBS[verb]
    target = two["sid"] if by == "id" else "a-web"
    r = call(two["hb"], method, f"/v1/sandboxes/{target}{tail}", body)
    assert r.status_code == 404, (verb, r.status_code, r.text)
    # Neither its id nor anything of it shows in the refusal.
    assert two["sid"] not in r.text or by == "id", r.text
    info = tw.http.get(f"/v1/sandboxes/{two['sid']}").json()
    assert info["state"] == "running" and info["tenant"] == "team-a", info


def test_names_are_each_tenants_own(tw, two):
    ha, hc = two["ha"], as_token(tw, new_tenant(tw, "team-names"))
    r = hc.post("/v1/sandboxes", json={"image": "busybox:latest", "name": "a-web"})
    assert r.status_code == 201, r.text
    theirs = r.json()["id"]
    try:
        assert theirs != two["sid"]
        assert hc.get("/v1/sandboxes/a-web").json()["id"] == theirs
        assert ha.get("/v1/sandboxes/a-web").json()["id"] == two["sid"]
        r = hc.post("/v1/sandboxes", json={"image": "busybox:latest", "name": "a-web"})
        assert r.status_code == 409 and theirs in r.text, r.text
        # The operator reaches both: the name alone does not say which.
        r = tw.http.get("/v1/sandboxes/a-web")
        assert r.status_code == 409 and "team-a, team-names" in r.text and "id" in r.text, r.text
    finally:
        hc.delete(f"/v1/sandboxes/{theirs}")


def test_lists_events_usage_and_logs_show_only_the_tenants_own(tw, two):
    hb, sid = two["hb"], two["sid"]
    assert hb.get("/v1/sandboxes", params={"all": "true"}).json() == []
    assert all(e["sandbox_id"] != sid for e in hb.get("/v1/events").json())
    assert hb.get("/v1/events", params={"sandbox": sid}).json() == []
    assert hb.get("/v1/usage").json()["sandboxes"] == []
    assert hb.get("/v1/logs", params={"label": "who=a"}).text == ""
    assert hb.get("/v1/batches").json() == [] and hb.get("/v1/pools").json() == []
    assert hb.get("/v1/secrets").json() == []
    assert [t["name"] for t in hb.get("/v1/tenants").json()] == ["team-b"]
    # The bulk delete reaches only b's own.
    assert hb.delete("/v1/sandboxes", params={"label": "who=a"}).json() == []
    # The owner and the operator see it.
    assert [s["id"] for s in two["ha"].get("/v1/sandboxes", params={"label": "who=a"}).json()] == [sid]
    assert sid in [s["id"] for s in tw.http.get("/v1/sandboxes").json()]


@pytest.mark.parametrize("what", ["batch_get", "batch_delete", "pool_get", "pool_put", "pool_delete",
                                  "secret_get", "secret_set", "secret_delete", "secret_use"])
def test_another_tenants_batches_pools_and_secrets_are_not_found(tw, two, what):
    hb, batch = two["hb"], two["batch"]
    r = {
        "batch_get": lambda: hb.get(f"/v1/batches/{batch}"),
        "batch_delete": lambda: hb.delete(f"/v1/batches/{batch}"),
        "pool_get": lambda: hb.get("/v1/pools/a-pool"),
        "pool_put": lambda: hb.put("/v1/pools/a-pool", json={"image": "busybox:latest", "size": 1}),
        "pool_delete": lambda: hb.delete("/v1/pools/a-pool"),
        "secret_get": lambda: hb.get("/v1/secrets/a-key"),
        "secret_set": lambda: hb.put("/v1/secrets/a-key", json={"value": "stolen"}),
        "secret_delete": lambda: hb.delete("/v1/secrets/a-key"),
        # Naming another tenant's secret in a spec is naming none.
        "secret_use": lambda: hb.post("/v1/sandboxes", json={"image": "busybox:latest", "secrets": ["a-key"]}),
    }[what]()
    assert r.status_code in (400, 404), (what, r.status_code, r.text)
    assert tw.http.get(f"/v1/batches/{batch}").json().get("deleted_at") is None
    assert tw.http.get("/v1/pools/a-pool").json()["spec"]["size"] == 0
    assert tw.http.get("/v1/secrets/a-key").json()["version"] == 1


def test_a_pools_members_serve_only_its_own_tenants_creates(tw, two):
    from helpers import wait_until

    ha, hb = two["ha"], two["hb"]
    r = ha.put("/v1/pools/a-warm", json={"image": "busybox:latest", "memory": "64M", "size": 1})
    assert r.status_code == 200, r.text
    try:
        wait_until(lambda: tw.http.get("/v1/pools/a-warm").json()["ready"] == 1, timeout=30, what="a ready member")
        r = hb.post("/v1/sandboxes", json={"image": "busybox:latest", "memory": "64M"})
        assert r.status_code == 201 and r.json()["tenant"] == "team-b", r.text
        hb.delete(f"/v1/sandboxes/{r.json()['id']}")
        assert tw.http.get("/v1/pools/a-warm").json()["claimed"] == 0
        r = ha.post("/v1/sandboxes", json={"image": "busybox:latest", "memory": "64M"})
        assert r.status_code in (200, 201) and r.json()["tenant"] == "team-a", r.text
        ha.delete(f"/v1/sandboxes/{r.json()['id']}")
        assert tw.http.get("/v1/pools/a-warm").json()["claimed"] == 1
    finally:
        ha.delete("/v1/pools/a-warm")


def test_a_tenants_volumes_are_its_own_through_both_doors(tw, two):
    ha, hb = two["ha"], two["hb"]
    ka, kb = {"X-API-KEY": two["a"]}, {"X-API-KEY": "e2b_" + two["b"]}
    r = ha.post("/v1/volumes", json={"name": "a-vol", "size": "16M"})
    assert r.status_code == 201, r.text
    try:
        # Tenant b finds nothing of it, by any verb or door; its name is
        # the cluster's, taken without saying where.
        assert "a-vol" not in [v["name"] for v in hb.get("/v1/volumes").json()]
        assert hb.delete("/v1/volumes/a-vol").status_code == 404
        r = hb.post("/v1/volumes", json={"name": "a-vol", "size": "16M"})
        assert r.status_code == 409 and "node" not in r.json()["error"]["message"], r.text
        r = hb.post("/v1/sandboxes", json={"image": "busybox:latest", "volumes": [{"name": "a-vol", "path": "/mnt/v"}]})
        assert r.status_code == 404, r.text
        assert httpx.get(f"{tw.e2b_api}/volumes/a-vol", headers=kb).status_code == 404
        assert httpx.delete(f"{tw.e2b_api}/volumes/a-vol", headers=kb).status_code == 404
        assert "a-vol" not in [v["name"] for v in httpx.get(f"{tw.e2b_api}/volumes", headers=kb).json()]
        # Tenant a mounts it; the operator sees it.
        assert httpx.get(f"{tw.e2b_api}/volumes/a-vol", headers=ka).status_code == 200
        r = ha.post("/v1/sandboxes", json={"image": "busybox:latest", "memory": "32M", "volumes": [{"name": "a-vol", "path": "/mnt/v"}],
                                           "cmd": ["sh", "-c", "echo kept > /mnt/v/f"]})
        assert r.status_code == 201 and r.json()["tenant"] == "team-a", r.text
        sid = r.json()["id"]
        from helpers import wait_until
        wait_until(lambda: tw.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "destroyed", timeout=30,
                   what="the writer to end")
        assert "a-vol" in [v["name"] for v in tw.http.get("/v1/volumes").json()]
        assert [v["name"] for v in ha.get("/v1/volumes").json()] == ["a-vol"]
    finally:
        assert ha.delete("/v1/volumes/a-vol").status_code == 200
    assert "a-vol" not in [v["name"] for v in tw.http.get("/v1/volumes").json()]


def build(h, dockerfile, tag):
    """Builds a one-file context through the API as `h`; its events."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    r = h.post("/v1/builds", params={"tag": tag}, content=buf.getvalue(), timeout=120)
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def test_a_tenants_images_are_its_own(tw, two):
    ha, hb = two["ha"], two["hb"]
    names = lambda h: {i["name"] for i in h.get("/v1/images").json()}
    r = ha.post(f"/v1/sandboxes/{two['sid']}/commit", json={"name": "team-a/app:1"})
    assert r.status_code == 201, r.text
    assert {"team-a/app:1", "busybox:latest"} <= names(ha) and "team-a/app:1" in names(tw.http)
    assert "team-a/app:1" not in names(hb) and "busybox:latest" in names(hb)
    # To b, a's image is no image: it cannot run it, build on it, take
    # its name or remove it.
    r = hb.post("/v1/sandboxes", json={"image": "team-a/app:1"})
    assert r.status_code == 404 and "image team-a/app:1 not found" in r.text, r.text
    events = build(hb, "FROM team-a/app:1\n", "team-b/app:1")
    assert events[-1]["type"] == "failed" and "not found" in events[-1]["message"], events
    r = hb.post("/v1/sandboxes", json={"image": "busybox:latest"})
    theirs = r.json()["id"]
    try:
        r = hb.post(f"/v1/sandboxes/{theirs}/commit", json={"name": "team-b/tool"})
        assert r.status_code == 201, r.text
        r = hb.post(f"/v1/sandboxes/{theirs}/commit", json={"name": "team-a/app:1"})
        assert r.status_code == 409 and "taken" in r.text, r.text
        # Nor may it replace a shared image every tenant runs.
        r = hb.post(f"/v1/sandboxes/{theirs}/commit", json={"name": "busybox:latest"})
        assert r.status_code == 403 and "shared" in r.text, r.text
    finally:
        hb.delete(f"/v1/sandboxes/{theirs}")
    assert hb.delete("/v1/images/team-a/app:1").status_code == 404
    assert hb.delete("/v1/images/busybox:latest").status_code == 403
    # A build on a shared image is b's: its tag, its build, its sandboxes.
    events = build(hb, "FROM busybox:latest\nRUN echo b > /who\n", "team-b/app:1")
    assert events[-1]["type"] == "done", events
    assert "team-b/app:1" in names(hb) and "team-b/app:1" not in names(ha)
    assert ha.get(f"/v1/builds/{events[0]['id']}").status_code == 404
    assert hb.get(f"/v1/builds/{events[0]['id']}").json()["state"] == "succeeded"
    r = ha.post("/v1/sandboxes", json={"image": "team-a/app:1"})
    assert r.status_code == 201, r.text
    ha.delete(f"/v1/sandboxes/{r.json()['id']}")
    for h, name in [(ha, "team-a/app:1"), (hb, "team-b/tool:latest"), (hb, "team-b/app:1")]:
        assert h.delete(f"/v1/images/{name}").status_code == 200, name
    assert "team-a/app:1" not in names(tw.http)


def test_a_tenants_profiles_are_its_own(tw, two):
    from helpers import wait_until

    hb, mib = two["hb"], 1 << 20
    table = '[profiles.shared-task]\ncpu = 0.75\nmemory = "96M"\n'
    assert tw.http.post("/v1/profiles/import", content=table).status_code == 200
    mine = tw.create(labels={"task": "shared-task"})
    assert mine["resources"]["memory"] == 96 * mib
    tw.http.delete(f"/v1/sandboxes/{mine['id']}")
    # The operator's profile does not size b's sandboxes of the same task,
    # and b's runs teach b's own profile, not the operator's.
    r = hb.post("/v1/sandboxes", json={"image": "busybox:latest", "labels": {"task": "shared-task"}})
    assert r.status_code == 201 and r.json()["resources"]["memory"] != 96 * mib, r.text
    hb.delete(f"/v1/sandboxes/{r.json()['id']}")
    profiles = lambda: {p["name"]: p for p in tw.http.get("/v1/profiles").json()}
    wait_until(lambda: "team-b/shared-task" in profiles(), timeout=30, what="b's run to teach b's profile")
    assert profiles()["shared-task"]["runs"] == 1, profiles()["shared-task"]
    exported = tw.http.get("/v1/profiles/export").text
    assert '[profiles."team-b/shared-task"]' in exported, exported
    assert tw.http.post("/v1/profiles/import", content=exported).status_code == 200


def test_the_operators_routes_are_refused_to_tenants(tw, two):
    hb = two["hb"]
    for method, path in [("GET", "/v1/nodes"), ("GET", "/metrics"), ("POST", "/v1/tenants"),
                         ("DELETE", "/v1/tenants/team-a"), ("POST", "/v1/images/gc"),
                         ("GET", "/v1/profiles")]:
        r = hb.request(method, path, json={})
        assert r.status_code == 403 and "operator" in r.json()["error"]["message"], (method, path, r.text)


def test_a_viewer_reads_and_changes_nothing(tw, two):
    made = two["ha"].post("/v1/tokens", json={"tenant": "team-a", "role": "viewer"})
    assert made.status_code == 201, made.text
    v = as_token(tw, made.json()["token"])
    sid = two["sid"]
    assert v.get(f"/v1/sandboxes/{sid}").status_code == 200
    assert v.get(f"/v1/sandboxes/{sid}/logs").status_code == 200
    for method, path, body in [("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["true"]}),
                               ("DELETE", f"/v1/sandboxes/{sid}", None),
                               ("POST", "/v1/sandboxes", {"image": "busybox:latest"}),
                               ("POST", "/v1/tokens", {"tenant": "team-a", "role": "admin"})]:
        r = call(v, method, path, body)
        assert r.status_code == 403, (path, r.text)
    assert tw.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"


def test_tokens_are_kept_hashed_listed_without_values_and_revoked_at_once(tw, two):
    made = two["ha"].post("/v1/tokens", json={"tenant": "team-a", "role": "user", "description": "ci"}).json()
    token, tid = made["token"], made["id"]
    h = as_token(tw, token)
    assert h.get("/v1/sandboxes").status_code == 200
    listed = tw.cli("token", "ls").stdout.decode()
    assert tid in listed and "wrt_" not in listed
    # A tenant's admin sees its own tenant's tokens only; b's cannot revoke a's.
    assert all(t["tenant"] == "team-b" for t in two["hb"].get("/v1/tokens").json())
    assert two["hb"].delete(f"/v1/tokens/{tid}").status_code == 404
    stored = b"".join(p.read_bytes() for p in tw.home.glob("warren.db*"))
    assert token.encode() not in stored
    tw.cli("token", "revoke", tid)
    r = h.get("/v1/sandboxes")
    assert r.status_code == 401, r.text


# Every E2B control call that names one sandbox, as (method, path, body).
E2B_VERBS = {
    "detail": ("GET", "", None),
    "kill": ("DELETE", "", None),
    "connect": ("POST", "/connect", {"timeout": 60}),
    "resume": ("POST", "/resume", {"timeout": 60}),
    "timeout": ("POST", "/timeout", {"timeout": 1}),
    "pause": ("POST", "/pause", None),
    "metrics": ("GET", "/metrics", None),
    "network": ("PUT", "/network", {"allowOut": []}),
    "fork": ("POST", "/fork", {}),
    "snapshot": ("POST", "/snapshots", {}),
}


@pytest.fixture(scope="module")
def e2b_a(tw, two):
    """A sandbox of tenant a, made through the E2B door."""
    r = httpx.post(f"{tw.e2b_api}/sandboxes", headers={"X-API-KEY": two["a"]},
                   json={"templateID": "busybox:latest", "timeout": 300}, timeout=60)
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    assert tw.http.get(f"/v1/sandboxes/{sid}").json()["tenant"] == "team-a"
    yield sid
    httpx.delete(f"{tw.e2b_api}/sandboxes/{sid}", headers={"X-API-KEY": two["a"]})


@pytest.mark.parametrize("verb", sorted(E2B_VERBS))
def test_the_e2b_door_hides_another_tenants_sandbox_from_every_verb(tw, two, e2b_a, verb):
    method, tail, body = E2B_VERBS[verb]
    kb = {"X-API-KEY": "e2b_" + two["b"]}
    r = httpx.request(method, f"{tw.e2b_api}/sandboxes/{e2b_a}{tail}", headers=kb, json=body)
    assert r.status_code == 404, (verb, r.status_code, r.text)
    assert tw.http.get(f"/v1/sandboxes/{e2b_a}").json()["state"] == "running"


def test_the_e2b_door_lists_each_tenant_its_own(tw, two, e2b_a):
    ka, kb = {"X-API-KEY": two["a"]}, {"X-API-KEY": "e2b_" + two["b"]}
    assert e2b_a not in [s["sandboxID"] for s in httpx.get(f"{tw.e2b_api}/v2/sandboxes", headers=kb).json()]
    assert e2b_a in [s["sandboxID"] for s in httpx.get(f"{tw.e2b_api}/v2/sandboxes", headers=ka).json()]
    assert httpx.get(f"{tw.e2b_api}/secrets", headers=kb).json() == []


def test_e2b_templates_and_snapshots_are_their_tenants(tw, two, e2b_a):
    from helpers import wait_until

    ka, kb = {"X-API-KEY": two["a"]}, {"X-API-KEY": "e2b_" + two["b"]}
    api = tw.e2b_api
    r = httpx.post(f"{api}/v3/templates", headers=ka, json={"name": "a-tpl"})
    assert r.status_code == 202, r.text
    tid, bid = r.json()["templateID"], r.json()["buildID"]
    # b can neither take the name nor follow or start a's build.
    r = httpx.post(f"{api}/v3/templates", headers=kb, json={"name": "a-tpl"})
    assert r.status_code == 409, r.text
    assert httpx.get(f"{api}/templates/{tid}/builds/{bid}/status", headers=kb).status_code == 404
    r = httpx.post(f"{api}/v2/templates/{tid}/builds/{bid}", headers=kb, json={"fromImage": "busybox:latest"})
    assert r.status_code == 404, r.text
    r = httpx.post(f"{api}/v2/templates/{tid}/builds/{bid}", headers=ka,
                   json={"fromImage": "busybox:latest", "steps": [{"type": "RUN", "args": ["echo a > /who"]}]})
    assert r.status_code == 202, r.text
    status = lambda: httpx.get(f"{api}/templates/{tid}/builds/{bid}/status", headers=ka).json()["status"]
    wait_until(lambda: status() in ("ready", "error"), timeout=120, what="a's template build")
    assert status() == "ready", httpx.get(f"{api}/templates/{tid}/builds/{bid}/status", headers=ka).text
    # a's template is a's: its image is a's, and b finds no template of that name.
    assert httpx.get(f"{api}/templates/aliases/a-tpl", headers=ka).json()["templateID"] == tid
    assert httpx.get(f"{api}/templates/aliases/a-tpl", headers=kb).status_code == 404
    r = httpx.post(f"{api}/sandboxes", headers=kb, json={"templateID": "a-tpl", "timeout": 60}, timeout=60)
    assert r.status_code == 404, r.text
    r = httpx.post(f"{api}/sandboxes", headers=ka, json={"templateID": "a-tpl", "timeout": 60}, timeout=60)
    assert r.status_code == 201, r.text
    httpx.delete(f"{api}/sandboxes/{r.json()['sandboxID']}", headers=ka)
    # A snapshot of a's sandbox is a's alike.
    r = httpx.post(f"{api}/sandboxes/{e2b_a}/snapshots", headers=ka, json={"name": "a-snap"}, timeout=60)
    assert r.status_code == 201, r.text
    snap = r.json()["snapshotID"]
    listed = lambda k: [x["snapshotID"] for x in httpx.get(f"{api}/snapshots", headers=k).json()]
    assert snap in listed(ka) and snap not in listed(kb)
    assert httpx.delete(f"{api}/templates/{snap}", headers=kb).status_code == 404
    assert httpx.delete(f"{api}/templates/a-tpl", headers=kb).status_code == 404
    for name in (snap, "a-tpl"):
        r = httpx.delete(f"{api}/templates/{name}", headers=ka)
        assert r.status_code == 204, (name, r.text)


def test_a_tenant_is_removed_only_once_it_owns_nothing(tw):
    token = new_tenant(tw, "team-gone")
    h = as_token(tw, token)
    sid = h.post("/v1/sandboxes", json={"image": "busybox:latest"}).json()["id"]
    p = tw.cli("tenant", "rm", "team-gone", check=False)
    assert p.returncode == 1 and b"1 sandboxes" in p.stderr, p.stderr
    assert h.delete(f"/v1/sandboxes/{sid}").status_code == 200
    tw.cli("tenant", "rm", "team-gone")
    assert h.get("/v1/sandboxes").status_code == 401
    assert "team-gone" not in tw.cli("tenant", "ls").stdout.decode()


def test_a_tenants_egress_policy_bounds_its_sandboxes_rules(tw):
    token = new_tenant(tw, "team-net", "--egress", "pypi.org:443")
    h = as_token(tw, token)
    r = h.post("/v1/sandboxes", json={"image": "busybox:latest",
                                      "network": {"mode": "allowlist", "allow": ["evil.example:443"]}})
    assert r.status_code == 403 and "egress" in r.json()["error"]["message"], r.text
    r = h.post("/v1/sandboxes", json={"image": "busybox:latest",
                                      "network": {"mode": "allowlist", "allow": ["pypi.org:443"]}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = h.patch(f"/v1/sandboxes/{sid}/network", json={"allow": ["evil.example:443"]})
    assert r.status_code == 403, r.text
    h.delete(f"/v1/sandboxes/{sid}")


def test_every_change_is_audited_with_its_tenant_and_token(tw):
    import json

    token = new_tenant(tw, "team-audit")
    h = as_token(tw, token)
    tid = h.get("/v1/whoami").json()["token"]
    sid = h.post("/v1/sandboxes", json={"image": "busybox:latest"}).json()["id"]
    assert h.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]}).status_code == 200
    assert h.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/f"}, content=b"x").status_code in (200, 201, 204)
    assert h.get(f"/v1/sandboxes/{sid}").status_code == 200  # a read: not audited
    assert h.delete(f"/v1/sandboxes/{sid}").status_code == 200
    made = httpx.post(f"{tw.e2b_api}/sandboxes", headers={"X-API-KEY": token},
                      json={"templateID": "busybox:latest"}, timeout=60).json()
    e2b = made["sandboxID"]
    envd = {"E2b-Sandbox-Id": e2b, "E2b-Sandbox-Port": "49983", "X-Access-Token": made["envdAccessToken"]}
    for call in ("Stat", "MakeDir"):
        r = httpx.post(f"{tw.e2b_sandbox}/filesystem.Filesystem/{call}", json={"path": "/tmp/d"}, headers=envd)
        assert r.status_code in (200, 404), r.text
    httpx.delete(f"{tw.e2b_api}/sandboxes/{e2b}", headers={"X-API-KEY": token})
    out = tw.cli("audit", "--tenant", "team-audit", "--since", "10m", "--json").stdout.decode()
    lines = [json.loads(l) for l in out.splitlines()]
    calls = [(l["door"], l["method"], l["route"], l.get("target", ""), l["status"]) for l in lines]
    assert calls == [
        ("api", "POST", "/v1/sandboxes", "", 201),
        ("api", "POST", "/v1/sandboxes/{id}/exec", sid, 200),
        ("api", "PUT", "/v1/sandboxes/{id}/files", sid, 204),
        ("api", "DELETE", "/v1/sandboxes/{id}", sid, 200),
        ("e2b", "POST", "/sandboxes", "", 201),
        ("envd", "POST", "/filesystem.Filesystem/MakeDir", e2b, 200),
        ("e2b", "DELETE", "/sandboxes/{id}", e2b, 204),
    ], calls
    assert {l["token"] for l in lines} == {tid, "envd-access-token"}
    assert {l["tenant"] for l in lines} == {"team-audit"}
    # A refused change is audited too, with its status.
    assert h.delete("/v1/sandboxes/sbx-nosuchthing").status_code == 404
    assert h.get("/v1/audit", params={"limit": 1}).json()[0]["status"] == 404
    # A tenant's admin reads its own tenant's lines only; a user none.
    assert {l["tenant"] for l in h.get("/v1/audit", params={"tenant": "default"}).json()} == {"team-audit"}
    user = h.post("/v1/tokens", json={"tenant": "team-audit", "role": "user"}).json()["token"]
    assert as_token(tw, user).get("/v1/audit").status_code == 403
    assert tw.http.get("/v1/audit", params={"since": "yesterday"}).status_code == 400


def test_a_tenants_usage_against_its_quota_shows_in_ls_and_metrics(tw):
    import json

    token = new_tenant(tw, "team-q", "--cpu", "2", "--memory", "1G", "--sandboxes", "5", "--weight", "3")
    h = as_token(tw, token)
    sid = h.post("/v1/sandboxes", json={"image": "busybox:latest", "cpu": 0.5, "memory": "128M"}).json()["id"]
    try:
        t = next(t for t in json.loads(tw.cli("tenant", "ls", "--json").stdout) if t["name"] == "team-q")
        assert t["usage"] == {"cpu_millis": 500, "memory": 128 << 20, "gpus": 0, "sandboxes": 1}, t
        assert t["quota"] == {"cpu": 2.0, "memory": 1 << 30, "sandboxes": 5} and t["weight"] == 3, t
        text = tw.http.get("/metrics").text
        for line in ['warren_tenant_requested{tenant="team-q",resource="cpu"} 0.5',
                     'warren_tenant_quota{tenant="team-q",resource="sandboxes"} 5.0',
                     'warren_tenant_queued{tenant="team-q"} 0',
                     'warren_tenant_weight{tenant="team-q"} 3']:
            assert line in text, line
    finally:
        h.delete(f"/v1/sandboxes/{sid}")


# ------------------------------------------------------------ quotas and fair share


@pytest.fixture(scope="module")
def tight(images):
    """A node whose CPU requests bind (1.75 cores lent): three sandboxes of
    half a core fill it."""
    with own_daemon(images, args=["--cpu-overcommit", "1", "--queue-limit", "8"]) as w:
        yield w


HALF = {"image": "busybox:latest", "cpu": 0.5, "memory": "32M"}


def test_a_create_over_its_tenants_quota_waits_and_says_which_quota(tight):
    h = as_token(tight, new_tenant(tight, "team-cap", "--sandboxes", "1", "--cpu", "1"))
    first = h.post("/v1/sandboxes", json=HALF).json()["id"]
    r = h.post("/v1/sandboxes", params={"wait": "false"}, json=HALF)
    assert r.status_code == 202, r.text
    second = r.json()
    assert second["state"] == "queued" and "team-cap's sandboxes quota (1 sandboxes) is in use" in second["waiting_for"], second
    # Room on the node does not matter: the quota holds it.
    assert h.get(f"/v1/sandboxes/{second['id']}").json()["state"] == "queued"
    # More than the quota itself is refused at once, naming it.
    r = h.post("/v1/sandboxes", json={**HALF, "cpu": 2})
    assert r.status_code == 400 and "quota" in r.json()["error"]["message"], r.text
    h.delete(f"/v1/sandboxes/{first}")
    from helpers import wait_until

    wait_until(lambda: h.get(f"/v1/sandboxes/{second['id']}").json()["state"] == "running", timeout=30,
               what="the queued create to start once the quota frees")
    h.delete(f"/v1/sandboxes/{second['id']}")


def test_a_creates_own_priority_orders_its_tenants_queue_up_to_the_tenants(tight):
    from helpers import wait_until

    h = as_token(tight, new_tenant(tight, "team-prio", "--sandboxes", "1", "--priority", "5"))
    first = h.post("/v1/sandboxes", json=HALF).json()["id"]
    low = h.post("/v1/sandboxes", params={"wait": "false"}, json={**HALF, "priority": 1}).json()
    high = h.post("/v1/sandboxes", params={"wait": "false"}, json=HALF).json()
    assert low["state"] == high["state"] == "queued", (low, high)
    assert (low["spec"]["priority"], high["spec"].get("priority")) == (1, None)
    # Above the tenant's own is refused, and nothing is queued.
    r = h.post("/v1/sandboxes", params={"wait": "false"}, json={**HALF, "priority": 6})
    assert r.status_code == 403 and "priority 6 is above tenant team-prio's (5)" in r.text, r.text
    assert len(h.get("/v1/sandboxes").json()) == 3
    # The later create at the tenant's priority 5 goes before the earlier at 1.
    h.delete(f"/v1/sandboxes/{first}")
    state = lambda s: h.get(f"/v1/sandboxes/{s['id']}").json()["state"]
    wait_until(lambda: state(high) == "running", timeout=30, what="the higher-priority create to start")
    assert state(low) == "queued"
    h.delete(f"/v1/sandboxes/{high['id']}")
    wait_until(lambda: state(low) == "running", timeout=30, what="the lower-priority create to start next")
    h.delete(f"/v1/sandboxes/{low['id']}")


def test_a_preempting_tenant_takes_its_share_back_from_a_borrower(tight):
    from helpers import wait_until

    borrower = as_token(tight, new_tenant(tight, "team-borrow"))
    owner = as_token(tight, new_tenant(tight, "team-own", "--preempt"))
    ids = []
    for _ in range(3):
        r = borrower.post("/v1/sandboxes", json=HALF)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    # The node is full with the borrower's; the owner's create preempts
    # the borrower's newest and starts in its place.
    r = owner.post("/v1/sandboxes", json=HALF, timeout=60)
    assert r.status_code == 201 and r.json()["state"] == "running", r.text
    mine = r.json()["id"]
    newest = borrower.get(f"/v1/sandboxes/{ids[-1]}").json()
    assert newest["state"] == "preempted" and newest["reason"] == "preempted", newest
    assert [borrower.get(f"/v1/sandboxes/{i}").json()["state"] for i in ids[:2]] == ["running", "running"]
    events = borrower.get("/v1/events", params={"sandbox": ids[-1], "type": "preempted"}).json()
    assert events and events[-1]["state"] == "preempted", events
    for i in ids[:2]:
        borrower.delete(f"/v1/sandboxes/{i}")
    owner.delete(f"/v1/sandboxes/{mine}")
    wait_until(lambda: not [s for s in tight.http.get("/v1/sandboxes").json()], timeout=30, what="all gone")
