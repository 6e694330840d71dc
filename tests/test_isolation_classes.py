"""Isolation classes through the control plane and its front doors, on a
node that cannot run gVisor (docs/api.md, "Isolation classes"): a class no
node offers, or one Warren does not know, is refused at once by every door
and leaves nothing; the class a sandbox runs in is recorded, and forks,
batches, warm pools and E2B templates keep it. The gvisor class itself, on
the real runsc, is tests/test_gvisor.py's."""

import tempfile
from pathlib import Path

import httpx
import pytest

import warren as sdk
from conftest import Warren, free_port
from helpers import uniq, wait_until

BB = "busybox:latest"
NOT_OFFERED = "no node offers isolation class gvisor"


@pytest.fixture(scope="module")
def plain(images):
    """A `warren up` whose node finds no runsc (so it offers `container`
    alone), with the E2B door and a template alias of each class."""
    base = Path(tempfile.mkdtemp(prefix="warren-classes-"))
    api = free_port()
    w = Warren(base / "home", free_port(),
               extra_args=["--runsc", str(base / "no-runsc"), "--e2b-api", f"127.0.0.1:{api}"])
    w.home.mkdir()
    (w.home / "e2b-templates.toml").write_text(
        f'[templates.plain]\nimage = "{BB}"\nisolation = "container"\n\n'
        f'[templates.untrusted]\nimage = "{BB}"\nisolation = "gvisor"\n')
    w.start()
    try:
        w.cli("image", "import", str(images["oci"]), "--name", BB)
        w.e2b_api = f"http://127.0.0.1:{api}"
        yield w
    finally:
        w.stop_and_remove(base)


def labelled(w, label):
    """Every sandbox (ended ones too) carrying t=label."""
    return w.http.get("/v1/sandboxes", params={"label": f"t={label}", "all": "true"}).json()


def refused(r, status, code, *words):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, err
    for w in words:
        assert w in err["message"], err["message"]
    return err["message"]


def test_an_unknown_class_is_refused_by_every_door_and_nothing_is_made(warren):
    t = uniq()
    spec = {"image": BB, "isolation": "kata", "labels": {"t": t}}
    refused(warren.http.post("/v1/sandboxes", json=spec), 400, "bad_request", "kata", "container", "gvisor")
    refused(warren.http.post("/v1/run", json={"spec": {**spec, "cmd": ["true"]}}), 400, "bad_request", "kata")
    refused(warren.http.post("/v1/batches", json={"count": 2, "spec": spec}), 400, "bad_request", "kata")
    pool = uniq("pool")
    refused(warren.http.put(f"/v1/pools/{pool}", json={"image": BB, "isolation": "kata", "size": 1}),
            400, "bad_request", "kata")
    p = warren.cli("create", "--image", BB, "--isolation", "kata", "--label", f"t={t}", check=False)
    assert p.returncode != 0 and p.stdout == b"", p
    assert b"expected container or gvisor" in p.stderr, p.stderr
    p = warren.cli("pool", "set", pool, "--image", BB, "--size", "1", "--isolation", "kata", check=False)
    assert p.returncode != 0 and b"expected container or gvisor" in p.stderr, p.stderr
    with sdk.Client(warren.url, token=warren.token) as client, pytest.raises(sdk.BadRequest, match="kata"):
        client.sandbox(BB, isolation="kata", labels={"t": t})
    assert labelled(warren, t) == []
    assert pool not in {p["name"] for p in warren.http.get("/v1/pools").json()}


def test_a_class_no_node_offers_is_refused_at_once_and_leaves_nothing(plain):
    w = plain
    assert [n["isolation"] for n in w.http.get("/v1/nodes").json()] == [["container"]]
    table = w.cli("node", "ls").stdout.decode().splitlines()
    assert "ISOLATION" in table[0] and "container" in table[1], table
    t = uniq()
    spec = {"image": BB, "isolation": "gvisor", "labels": {"t": t}}
    # As a node selector no node matches: 503 with Retry-After, at once.
    r = w.http.post("/v1/sandboxes", json=spec, timeout=10)
    message = refused(r, 503, "no_capacity", NOT_OFFERED, "runsc", "warren doctor")
    assert r.headers.get("retry-after"), r.headers
    # Not queued: a create that may wait is refused the same way.
    r = w.http.post("/v1/sandboxes", params={"wait": "false"}, json=spec, timeout=10)
    refused(r, 503, "no_capacity", NOT_OFFERED)
    refused(w.http.post("/v1/run", json={"spec": {**spec, "cmd": ["true"]}}, timeout=10),
            503, "no_capacity", NOT_OFFERED)
    # A batch is refused whole, before any member is made.
    batches = len(w.http.get("/v1/batches").json())
    refused(w.http.post("/v1/batches", json={"count": 3, "spec": spec}, timeout=10), 503, "no_capacity", NOT_OFFERED)
    assert len(w.http.get("/v1/batches").json()) == batches
    # The CLI says the same, and prints no id.
    p = w.cli("create", "--image", BB, "--isolation", "gvisor", "--label", f"t={t}", check=False)
    assert p.returncode != 0 and p.stdout == b"", p
    assert NOT_OFFERED.encode() in p.stderr, p.stderr
    pool = uniq("pool")
    p = w.cli("pool", "set", pool, "--image", BB, "--size", "1", "--isolation", "gvisor", check=False)
    assert p.returncode != 0 and NOT_OFFERED.encode() in p.stderr, p.stderr
    assert pool not in {p["name"] for p in w.http.get("/v1/pools").json()}
    # The SDK raises it (a create without a request id is not retried).
    with sdk.Client(w.url, token=w.token) as client, pytest.raises(sdk.NoCapacity) as e:
        client.sandbox(BB, isolation="gvisor", labels={"t": t})
    assert str(e.value).startswith(message[:40]), e.value
    assert labelled(w, t) == []


def test_the_class_a_sandbox_runs_in_is_recorded_and_kept(plain):
    w = plain
    t = uniq()
    # None named: the node's default, recorded and shown.
    s = w.create(labels={"t": t}, memory="32M")
    assert s["spec"]["isolation"] == "container", s["spec"]
    assert w.http.get(f"/v1/sandboxes/{s['id']}").json()["spec"]["isolation"] == "container"
    assert '"isolation": "container"' in w.cli("inspect", s["id"]).stdout.decode()
    with sdk.Client(w.url, token=w.token) as client:
        assert client.sandboxes.get(s["id"]).info.spec.isolation == "container"
        with client.sandbox(BB, isolation="container", labels={"t": t}, memory="32M") as sb:
            assert sb.info.spec.isolation == "container"
    # Fork children run in their source's class.
    r = w.http.post(f"/v1/sandboxes/{s['id']}/fork", json={"count": 2}, timeout=120)
    assert r.status_code == 201, r.text
    assert [c["spec"]["isolation"] for c in r.json()] == ["container", "container"]
    # A batch's members run in the batch spec's class.
    r = w.http.post("/v1/batches", json={"count": 2, "labels": {"t": t},
                                         "spec": {"image": BB, "memory": "32M", "isolation": "container"}})
    assert r.status_code in (200, 201, 202), r.text
    bid = r.json()["id"]
    members = wait_until(
        lambda: (m := [x for x in w.http.get("/v1/sandboxes", params={"label": f"warren.dev/batch={bid}"}).json()
                       if x["state"] == "running"]) and len(m) == 2 and m,
        timeout=60, what="the batch's members running")
    assert [m["spec"]["isolation"] for m in members] == ["container", "container"]
    w.http.delete("/v1/sandboxes", params={"label": f"t={t}"})


def claimed(w, sid):
    return any(e["reason"] == "claimed" for e in w.http.get(f"/v1/sandboxes/{sid}").json()["events"])


def test_a_pool_of_a_class_serves_creates_that_name_it(plain):
    w = plain
    t, pool = uniq(), uniq("pool")
    r = w.http.put(f"/v1/pools/{pool}", json={"image": BB, "memory": "48M", "isolation": "container", "size": 1})
    assert r.status_code in (200, 201), r.text
    assert r.json()["spec"]["isolation"] == "container"
    ready = lambda: w.http.get(f"/v1/pools/{pool}").json()["ready"] == 1  # noqa: E731
    try:
        wait_until(ready, timeout=60, what="the pool's member ready")
        member = w.create(memory="48M", isolation="container", labels={"t": t})
        assert claimed(w, member["id"]), member
        assert member["spec"]["isolation"] == "container"
        assert w.http.get(f"/v1/sandboxes/{member['id']}").json()["spec"]["isolation"] == "container"
        # A create that names no class is not served by it (its class is
        # its node's, which the pool's members need not share)...
        wait_until(ready, timeout=60, what="the pool refilled")
        fresh = w.create(memory="48M", labels={"t": t})
        assert not claimed(w, fresh["id"])
        assert fresh["spec"]["isolation"] == "container"
        assert w.http.get(f"/v1/pools/{pool}").json()["claimed"] == 1
    finally:
        w.http.delete(f"/v1/pools/{pool}")
        w.http.delete("/v1/sandboxes", params={"label": f"t={t}"})


def test_an_e2b_template_names_the_class(plain):
    w = plain
    key = {"X-API-KEY": w.token}
    r = httpx.post(f"{w.e2b_api}/sandboxes", json={"templateID": "plain"}, headers=key, timeout=60)
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    try:
        info = w.http.get(f"/v1/sandboxes/{sid}").json()
        assert info["spec"]["isolation"] == "container", info["spec"]
    finally:
        w.http.delete(f"/v1/sandboxes/{sid}")
    before = len(w.http.get("/v1/sandboxes", params={"all": "true"}).json())
    r = httpx.post(f"{w.e2b_api}/sandboxes", json={"templateID": "untrusted"}, headers=key, timeout=60)
    assert r.status_code == 503 and NOT_OFFERED in r.json()["message"], r.text
    assert len(w.http.get("/v1/sandboxes", params={"all": "true"}).json()) == before
