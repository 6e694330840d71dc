"""Bad input gets a clear error with a fitting status and changes nothing."""

import subprocess

import httpx
import pytest
from conftest import WARREN

from helpers import error_body, make_tar

BAD_SPECS = [
    pytest.param({"cpu": -1}, "cpu", id="negative-cpu"),
    pytest.param({"cpu": "-500m"}, "cpu", id="negative-millicores"),
    pytest.param({"cpu": 0}, "cpu", id="zero-cpu"),
    pytest.param({"memory": "1M"}, "16M", id="memory-below-floor"),
    pytest.param({"memory": "lots"}, "size", id="memory-garbage"),
    pytest.param({"pids": 0}, "pids", id="pids-zero"),
    pytest.param({"labels": {"bad key": "v"}}, "bad key", id="bad-label-key"),
    pytest.param({"labels": {"k": "bad value!"}}, "label", id="bad-label-value"),
    pytest.param({"bogus_field": 1}, "bogus_field", id="unknown-field"),
    pytest.param({"network": {"mode": "everything"}}, "", id="bad-network-mode"),
    pytest.param({"reclaim": "never"}, "", id="bad-reclaim"),
    pytest.param({"ttl": "forever"}, "", id="bad-ttl"),
    pytest.param({"image": ""}, "", id="empty-image"),
]


def counts(warren):
    live = warren.http.get("/v1/sandboxes").json()
    every = warren.http.get("/v1/sandboxes", params={"all": "true"}).json()
    return len(live), len(every)


@pytest.mark.parametrize("patch,needle", BAD_SPECS)
def test_bad_spec_is_400_and_creates_nothing(warren, patch, needle):
    before = counts(warren)
    spec = {"image": "busybox:latest", **patch}
    r = warren.http.post("/v1/sandboxes", json=spec)
    assert r.status_code == 400, r.text
    err = error_body(r)
    assert err["code"] == "bad_request"
    assert needle in err["message"], err
    assert counts(warren) == before


@pytest.mark.smoke  # errors
def test_missing_image_field_is_400(warren):
    before = counts(warren)
    for body in (b"{}", b"not json", b"[]"):
        r = warren.http.post("/v1/sandboxes", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        error_body(r)
    assert counts(warren) == before


def test_unknown_image_is_404_mentioning_import(warren):
    before = counts(warren)
    r = warren.http.post("/v1/sandboxes", json={"image": "no-such-image:404"})
    assert r.status_code == 404, r.text
    err = error_body(r)
    assert err["code"] == "not_found"
    assert "import" in err["message"] and "no-such-image" in err["message"], err
    assert counts(warren) == before
    # The CLI reports it too.
    p = warren.cli("create", "--image", "no-such-image:404", check=False)
    assert p.returncode != 0 and b"import" in p.stderr and p.stdout == b""
    assert counts(warren) == before


def test_unknown_sandbox_is_404(warren):
    sid = "sbx-000000000000"
    for method, path in [
        ("GET", f"/v1/sandboxes/{sid}"),
        ("DELETE", f"/v1/sandboxes/{sid}"),
        ("GET", f"/v1/sandboxes/{sid}/logs"),
        ("GET", f"/v1/sandboxes/{sid}/files?path=/etc/passwd"),
    ]:
        r = warren.http.request(method, path)
        assert r.status_code == 404, (method, path, r.text)
        assert error_body(r)["code"] == "not_found"
    r = warren.http.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]})
    assert r.status_code == 404
    p = warren.cli("inspect", sid, check=False)
    assert p.returncode != 0 and sid.encode() in p.stderr
    p = warren.cli("exec", sid, "--", "true", check=False)
    assert p.returncode != 0


def test_auth_required(warren):
    assert httpx.get(warren.url + "/healthz").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": warren.token}):
        for method, path in [
            ("GET", "/v1/sandboxes"),
            ("POST", "/v1/sandboxes"),
            ("GET", "/v1/images"),
            ("GET", "/v1/events"),
            ("GET", "/openapi.json"),
        ]:
            r = httpx.request(method, warren.url + path, headers=headers, json={"image": "busybox:latest"})
            assert r.status_code == 401, (headers, method, path, r.status_code)
            assert error_body(r)["code"] == "unauthorized"
    # The CLI with a wrong token fails.
    env = {**warren.env(), "WARREN_TOKEN": "wrong"}
    p = subprocess.run([str(WARREN), "ps"], env=env, capture_output=True)
    assert p.returncode != 0 and (b"401" in p.stderr or b"token" in p.stderr), p.stderr


def test_unauthenticated_create_creates_nothing(warren):
    before = counts(warren)
    r = httpx.post(warren.url + "/v1/sandboxes", json={"image": "busybox:latest"})
    assert r.status_code == 401
    assert counts(warren) == before


def test_exec_bad_requests(warren, sandbox):
    sid = sandbox()["id"]
    for body in ({"cmd": []}, {"cmd": ["true"], "stdin": "%%% not base64"}, {"cmd": ["true"], "timeout": "soon"}, {"cmd": ["true"], "nope": 1}, {}):
        r = warren.http.post(f"/v1/sandboxes/{sid}/exec", json=body)
        assert r.status_code == 400, (body, r.text)
        error_body(r)


def test_files_bad_requests(warren, sandbox):
    sid = sandbox()["id"]

    def put(params, content, headers=None):
        # Each rejected upload on its own connection (see
        # test_files.py::test_rejected_upload_keeps_connection_usable).
        with warren.client() as c:
            return c.put(f"/v1/sandboxes/{sid}/files", params=params, content=content, headers=headers)

    tar = make_tar([("../../../escape", "file", b"x", 0o644)])
    r = put({"path": "/tmp/t"}, tar, {"content-type": "application/x-tar"})
    assert r.status_code == 400, r.text
    assert error_body(r)["code"] == "bad_request"
    r = put({"path": "/tmp/x", "mode": "rwx"}, b"x")
    assert r.status_code == 400, r.text
    r = put({}, b"x")
    assert r.status_code == 400, r.text
    r = put({"path": "/tmp/g"}, b"not a tar at all" * 64, {"content-type": "application/x-tar"})
    assert r.status_code == 400, r.text


def test_bulk_delete_needs_selector(warren, sandbox):
    sid = sandbox()["id"]
    r = warren.http.delete("/v1/sandboxes")
    assert r.status_code == 400, r.text
    error_body(r)
    assert warren.http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    r = warren.http.get("/v1/sandboxes", params={"label": "bad key=x"})
    assert r.status_code == 400, r.text


def test_image_errors(warren):
    r = warren.http.post("/v1/images/import", content=b"")
    assert r.status_code == 400, r.text
    error_body(r)
    r = warren.http.delete("/v1/images/no-such-image:1")
    assert r.status_code == 404, r.text
    error_body(r)
