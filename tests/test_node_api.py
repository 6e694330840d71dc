"""The node API: what a control plane drives a node through over HTTP
(`warren up --node-transport http`, and nodes of a cluster). It takes the
node credential and nothing else."""

import httpx
import pytest

from conftest import UP_ARGS, free_port, own_daemon
from helpers import sh_ok

# Runs again with the node over HTTP: node API itself (docs/testing.md).
pytestmark = pytest.mark.contract


def test_the_node_api_takes_the_node_credential_and_refuses_the_api_token(images):
    port = free_port()
    args = ("--node-listen", f"127.0.0.1:{port}")
    if "--node-transport" not in UP_ARGS:  # the HTTP pass of the suite sets it already
        args += ("--node-transport", "http")
    with own_daemon(images, args=args) as w:
        node = f"http://127.0.0.1:{port}/node/v2"
        credential = (w.home / "node-credential").read_text().strip()
        api_token = (w.home / "token").read_text().strip()
        assert credential and credential != api_token
        refused = [
            httpx.post(f"{node}/info"),
            httpx.post(f"{node}/info", headers={"Authorization": f"Bearer {api_token}"}),
            httpx.post(f"{node}/inventory", headers={"Authorization": f"Bearer {credential[:-1]}"}),
            httpx.post(f"{node}/create", headers={"Authorization": f"Bearer {api_token}"}, json={}),
        ]
        for r in refused:
            assert r.status_code == 401, r.text
            assert r.json()["kind"] == "invalid" and "node credential" in r.json()["message"], r.text
        # The public API does not take the node credential either.
        r = httpx.get(f"{w.url}/v1/sandboxes", headers={"Authorization": f"Bearer {credential}"})
        assert r.status_code == 401, r.text
        # With it: the node's own view, which the control plane reconciles with.
        ok = {"Authorization": f"Bearer {credential}"}
        sid = w.create(cpu=0.1, memory="32M")["id"]
        assert sh_ok(w, sid, "echo through the node API") == "through the node API\n"
        # Every call is POST /node/v2/{call}, its arguments a JSON object.
        info = httpx.post(f"{node}/info", headers=ok)
        assert info.status_code == 200 and info.json()["load"]["sandboxes"] == 1, info.text
        held = httpx.post(f"{node}/inventory", headers=ok).json()
        assert [s["id"] for s in held] == [sid] and held[0]["phase"] == "running", held
        missing = httpx.post(f"{node}/status", headers=ok, json={"id": "sbx-000000000000", "read_usage": False})
        assert missing.status_code == 404 and missing.json()["kind"] == "not_found", missing.text
        w.destroy(sid)
