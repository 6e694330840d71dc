"""A pytest plugin that runs SandboxFusion's own runner tests
(sandbox/tests/runners of github.com/bytedance/SandboxFusion) against Warren's
SandboxFusion door (`warren up --sandbox-fusion ADDR`), unchanged.

Those tests talk to SandboxFusion's FastAPI app in-process:

    from fastapi.testclient import TestClient
    from sandbox.server.server import app
    client = TestClient(app)
    response = client.post('/run_code', json=request.model_dump())

Loaded with `-p fusion_suite_plugin` (scripts/fusion-suite.sh does it), this
module is imported before any test module, and:

- makes `fastapi.testclient.TestClient` (and starlette's) a plain httpx
  client of WARREN_FUSION_URL: `TestClient(app)` ignores `app`, and every
  `client.post('/run_code', json=...)` goes over HTTP to Warren;
- puts a stand-in `sandbox.server.server` (with `app = None`) in
  sys.modules, so that SandboxFusion's server (its database, datasets and
  pages) is never started, and no code can run on this machine in-process.
  The request and response models the tests use (`sandbox.server.sandbox_api`,
  `sandbox.runners`) are SandboxFusion's real ones, from the checkout;
- skips, with the reason, the tests of a language that Warren does not run
  (its 422) or whose toolchain the image lacks (Warren's SandboxError
  naming the missing program), found by asking the door once per language;
- marks the few known gaps (KNOWN below) xfail with their reason, strictly:
  a gap that gets fixed fails the run until its entry goes.

Environment:
  WARREN_FUSION_URL      the door, e.g. http://127.0.0.1:8080 (required)
  WARREN_FUSION_TOKEN    a bearer token, when the door takes one
  WARREN_FUSION_REQUIRE  comma-separated languages the image is built for: one
                         of them found missing stops the run (a broken
                         image or door must not pass as "all skipped")
"""

import os
import sys
import types
from collections import defaultdict

import httpx
import pytest

URL = os.environ.get("WARREN_FUSION_URL", "").rstrip("/")
if not URL:
    raise pytest.UsageError("fusion_suite_plugin: set WARREN_FUSION_URL to Warren's --sandbox-fusion address")
TOKEN = os.environ.get("WARREN_FUSION_TOKEN", "")
REQUIRE = {l for l in os.environ.get("WARREN_FUSION_REQUIRE", "").split(",") if l}
# A kotlin script compiles for ~10 s on one core; the slowest test asks for 40 s.
HTTP_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


class WarrenClient(httpx.Client):
    """Stands in for `TestClient(app)`: the same `.post`/`.get`, sent to
    Warren's door rather than into SandboxFusion's in-process app."""

    __test__ = False  # test modules import it as `TestClient`: not a test class

    def __init__(self, app=None, *args, **kwargs):
        headers = {"Authorization": f"Bearer {TOKEN}"} if TOKEN else {}
        super().__init__(base_url=URL, timeout=HTTP_TIMEOUT, headers=headers)


def _swap_test_client():
    import fastapi.testclient
    import starlette.testclient

    fastapi.testclient.TestClient = WarrenClient
    starlette.testclient.TestClient = WarrenClient


def _stub_server():
    # `from sandbox.server.server import app`: `sandbox` and `sandbox.server`
    # are namespace packages of the checkout; only the leaf is replaced.
    stub = types.ModuleType("sandbox.server.server")
    stub.__doc__ = "Stand-in for SandboxFusion's server: the tests reach Warren over HTTP instead."
    stub.app = None
    sys.modules["sandbox.server.server"] = stub


_swap_test_client()
_stub_server()

# Which language a test file exercises (the probe below asks the door about it).
FILE_LANGUAGE = {
    "test_bash.py": "bash", "test_cpp.py": "cpp", "test_csharp.py": "csharp",
    "test_cuda.py": "cuda", "test_d_ut.py": "D_ut", "test_go.py": "go",
    "test_go_test.py": "go_test", "test_isolation.py": "python", "test_java.py": "java",
    "test_jest.py": "jest", "test_julia.py": "julia", "test_junit.py": "junit",
    "test_jupyter.py": "jupyter", "test_kotlin_script.py": "kotlin_script",
    "test_lean.py": "lean", "test_lua.py": "lua", "test_nodejs.py": "nodejs",
    "test_perl.py": "perl", "test_php.py": "php", "test_pytest.py": "pytest",
    "test_python.py": "python", "test_python_gpu.py": "python_gpu", "test_r.py": "R",
    "test_racket.py": "racket", "test_ruby.py": "ruby", "test_rust.py": "rust",
    "test_scala.py": "scala", "test_swift.py": "swift", "test_typescript.py": "typescript",
    "test_verilog.py": "verilog",
}

# Known differences from SandboxFusion's own server, each with its reason.
# Strict xfail: when one is fixed, the XPASS fails the run until it goes.
KNOWN = {
    "test_isolation.py::test_isolation_network_external_access":
        "fetches https://www.sina.com.cn: a Warren sandbox has no network (the door's "
        "sandboxes are network none, and this machine reaches no such host)",
}

_probed = {}


def _probe(language):
    """None when the door runs `language` in its image; else why not."""
    if language in _probed:
        return _probed[language]
    with WarrenClient() as c:
        if language == "jupyter":
            r = c.post("/run_jupyter", json={"cells": ["1"], "total_timeout": 60})
        else:
            r = c.post("/run_code", json={"language": language, "code": "", "compile_timeout": 60,
                                          "run_timeout": 60})
    why = None
    if r.status_code == 422:
        why = f"Warren does not run {language} (422: {r.json()['detail'][0]['msg'][:160]})"
    elif r.status_code != 200:
        why = f"the door answered {r.status_code} to a {language} probe: {r.text[:200]}"
    else:
        body = r.json()
        if body.get("status") == "SandboxError" and "cannot run" in body.get("message", ""):
            why = f"the image has no toolchain for {language}: {body['message'][:200]}"
    if why and language in REQUIRE:
        pytest.exit(f"fusion-suite: {language} is required (WARREN_FUSION_REQUIRE) but {why}", returncode=3)
    _probed[language] = why
    return why


def pytest_configure(config):
    # SandboxFusion's pyproject leaves this one of its marks unregistered.
    config.addinivalue_line("markers", "lean: tests of lean (SandboxFusion's bundled Lean project)")


def pytest_report_header(config):
    return [f"SandboxFusion runner tests against Warren's door at {URL} (fusion_suite_plugin)"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        key = f"{item.path.name}::{item.name}"
        if key in KNOWN:
            item.add_marker(pytest.mark.xfail(reason=KNOWN[key], strict=True))


def pytest_runtest_setup(item):
    language = FILE_LANGUAGE.get(item.path.name)
    if language:
        why = _probe(language)
        if why:
            pytest.skip(why)


_tally = defaultdict(lambda: defaultdict(int))


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        name = os.path.basename(report.nodeid.split("::")[0])
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        _tally[FILE_LANGUAGE.get(name, name)][outcome] += 1


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    tr.section("SandboxFusion runner tests on Warren, by language")
    for language in sorted(_tally):
        t = _tally[language]
        tr.write_line(f"{language:14} " + ", ".join(f"{n} {k}" for k, n in sorted(t.items())))
    skipped = sorted({why for why in _probed.values() if why})
    if skipped:
        tr.write_line("skipped languages:")
        for why in skipped:
            tr.write_line(f"  - {why}")
