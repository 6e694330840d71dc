"""SandboxFusion's `/run_code` on Warren (`warren up --sandbox-fusion`),
driven by the real clients: the `sandbox-fusion` package and verl's own
reward helper, unmodified, each from PyPI (pinned) in a cached venv."""

import base64
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from conftest import ROOT, Warren, free_port, own_daemon
from debian import CACHE, cache_lock, debian_archive
from helpers import wait_until

SANDBOX_FUSION = "0.3.7"
VERL = "0.9.1"
VENV = CACHE / "venvs" / f"fusion-sf{SANDBOX_FUSION}-verl{VERL}"
VERL_UTILS = "verl/utils/reward_score/sandbox_fusion/utils.py"
IMAGE = "fusion-deb:1"
FRONT = "warren.dev/front=sandbox-fusion"


@pytest.fixture(scope="module")
def clients():
    """The venv's python and verl's utils.py, extracted from the wheel (not
    imported as a package: `import verl` pulls in torch)."""
    py = VENV / "bin" / "python"
    utils = VENV / "verl-utils" / "utils.py"
    with cache_lock(VENV.name):
        if not (py.exists() and utils.exists()):
            partial = VENV.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run(["python3", "-m", "venv", partial], check=True)
            pip = [partial / "bin" / "pip", "install", "-q", "--disable-pip-version-check"]
            got = subprocess.run([*pip, f"sandbox-fusion=={SANDBOX_FUSION}"], capture_output=True, text=True)
            wheels = partial / "wheels"
            if got.returncode == 0:
                got = subprocess.run(
                    [partial / "bin" / "pip", "download", "-q", "--no-deps", f"verl=={VERL}", "-d", wheels],
                    capture_output=True, text=True,
                )
            if got.returncode != 0:
                shutil.rmtree(partial, ignore_errors=True)
                # The suite installs what it needs (PyPI is reachable where it
                # runs): a client that cannot be installed fails the run.
                raise AssertionError(f"cannot install the clients from PyPI: {got.stderr[-500:]}")
            (wheel,) = wheels.glob("verl-*.whl")
            (partial / "verl-utils").mkdir()
            with zipfile.ZipFile(wheel) as z:
                (partial / "verl-utils" / "utils.py").write_bytes(z.read(VERL_UTILS))
            # The venv's scripts name its path; moving it would break them, so
            # it is made in place under its final name.
            shutil.rmtree(VENV, ignore_errors=True)
            subprocess.run(["python3", "-m", "venv", VENV], check=True)
            subprocess.run([VENV / "bin" / "pip", "install", "-q", "--disable-pip-version-check",
                            f"sandbox-fusion=={SANDBOX_FUSION}"], check=True)
            shutil.move(partial / "verl-utils", VENV / "verl-utils")
            shutil.rmtree(partial, ignore_errors=True)
    return SimpleNamespace(python=py, verl_utils=utils)


@pytest.fixture(scope="module")
def fusion(tmp_path_factory):
    # Debian with python3, g++ and a Jupyter kernel (built once and
    # cached): python, bash, cpp and /run_jupyter run; the other languages'
    # toolchains are missing.
    image_tar = debian_archive(tmp_path_factory.mktemp("fusion-image"),
                               ("python3", "g++", "python3-ipykernel", "python3-jupyter-client"))
    base = Path(tempfile.mkdtemp(prefix="warren-fusion-"))
    port = free_port()
    w = Warren(base / "home", free_port(),
               extra_args=["--sandbox-fusion", f"127.0.0.1:{port}", "--sandbox-fusion-image", IMAGE])
    w.home.mkdir()
    w.start()
    try:
        w.cli("image", "import", str(image_tar), "--name", IMAGE, timeout=300)
        yield SimpleNamespace(warren=w, url=f"http://127.0.0.1:{port}")
    finally:
        w.finish(base)


def fusion_sandboxes(w):
    r = w.http.get("/v1/sandboxes", params={"label": FRONT})
    assert r.status_code == 200, r.text
    return r.json()


def wait_no_fusion_sandboxes(w, timeout=30):
    deadline = time.time() + timeout
    while (left := fusion_sandboxes(w)) and time.time() < deadline:
        time.sleep(0.2)
    assert left == [], [(s["id"], s["state"]) for s in left]


def client(clients, fusion, body):
    """Runs `body` in the clients' venv with `url` and `utils` (verl's
    file) defined; returns what it prints as JSON."""
    prelude = textwrap.dedent(f"""
        import importlib.util, json
        url = {fusion.url!r}
        def verl():
            spec = importlib.util.spec_from_file_location("verl_sandbox_fusion_utils", {str(clients.verl_utils)!r})
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            return m
    """)
    p = subprocess.run([clients.python, "-c", prelude + textwrap.dedent(body)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def post(fusion, body, timeout=60):
    return httpx.post(fusion.url + "/run_code", json=body, timeout=timeout)


def test_ping(fusion):
    r = httpx.get(fusion.url + "/v1/ping")
    assert r.status_code == 200 and r.json() == "pong"


def test_sandbox_fusion_client(clients, fusion):
    out = client(clients, fusion, """
        from sandbox_fusion import RunCodeRequest, run_code, set_endpoint
        set_endpoint(url)
        def res(**kw):
            return json.loads(run_code(RunCodeRequest(**kw)).json())
        rev = res(code="print(input()[::-1])", stdin="abc", language="python")
        tle = res(code="import time; time.sleep(5)", run_timeout=1, language="python")
        files = res(code="import os\\nd = open('in/data.txt').read()\\nopen('out.txt', 'w').write(d.upper())\\nprint(os.getcwd())",
                    language="python", files={"in/data.txt": "aGVsbG8="}, fetch_files=["out.txt", "missing.txt"])
        sh = res(code="echo $((6 * 7)); echo oops >&2; exit 3", language="bash")
        print(json.dumps({"rev": rev, "tle": tle, "files": files, "sh": sh}, ))
    """)
    rev = out["rev"]
    assert rev["status"] == "Success", rev
    assert rev["run_result"]["stdout"] == "cba\n" and rev["compile_result"] is None
    assert rev["run_result"]["return_code"] == 0 and rev["run_result"]["execution_time"] > 0

    tle = out["tle"]
    assert tle["status"] == "Failed", tle
    assert tle["run_result"]["status"] == "TimeLimitExceeded"
    assert tle["run_result"]["return_code"] is None
    assert 0.9 < tle["run_result"]["execution_time"] < 4

    files = out["files"]
    assert files["status"] == "Success", files
    assert files["run_result"]["stdout"].startswith("/tmp/tmp")
    assert files["files"] == {"out.txt": base64.b64encode(b"HELLO").decode()}

    sh = out["sh"]
    assert sh["status"] == "Failed", sh
    assert sh["run_result"]["stdout"] == "42\n" and sh["run_result"]["stderr"] == "oops\n"
    assert sh["run_result"]["return_code"] == 3


def test_bare_code_post_is_python(fusion):
    r = post(fusion, {"code": "import sys; print(1); print(sys.stdin.read() == '')"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert body["status"] == "Success" and body["message"] == "" and body["files"] == {}
    assert body["run_result"]["stdout"] == "1\nTrue\n"
    assert set(body["run_result"]) == {"status", "execution_time", "return_code", "stdout", "stderr"}


def test_run_code_takes_its_sandbox_from_a_warm_pool(fusion):
    w = fusion.warren
    # Python's sizes on /run_code (0.5 core, 256M): a pool of them serves it.
    r = w.http.put("/v1/pools/fusion-py", json={"image": IMAGE, "cpu": "500m", "memory": "256M", "size": 2})
    assert r.status_code == 200, r.text
    try:
        deadline = time.time() + 60
        while w.http.get("/v1/pools/fusion-py").json()["ready"] < 2:
            assert time.time() < deadline
            time.sleep(0.05)
        for i in range(3):
            r = post(fusion, {"code": f"print({i} * 7)", "language": "python"})
            assert r.status_code == 200 and r.json()["run_result"]["stdout"] == f"{i * 7}\n", r.text
        assert w.http.get("/v1/pools/fusion-py").json()["claimed"] >= 2
    finally:
        assert w.http.delete("/v1/pools/fusion-py").status_code == 200
    wait_no_fusion_sandboxes(w)


def test_bad_requests_are_422_with_the_reason(fusion):
    r = post(fusion, {"language": "python"})
    assert r.status_code == 422 and "code" in r.text, r.text
    r = post(fusion, {"code": "x", "language": "cobol"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "language"] and "'python'" in r.text
    r = post(fusion, {"code": "x", "language": "junit"})
    assert r.status_code == 422 and "Warren runs: python" in r.text, r.text
    r = post(fusion, {"code": "x", "files": {"a.txt": "not base64!"}})
    assert r.status_code == 422 and "base64" in r.text, r.text
    assert fusion_sandboxes(fusion.warren) == []


def test_fetched_files_are_read_once_and_bounded(fusion):
    """A call that asks for one big file under several spellings neither
    inflates the daemon's memory nor its answer: it is the call's error."""
    w = fusion.warren

    def rss():
        status = Path(f"/proc/{w.proc.pid}/status").read_text()
        return int(next(l for l in status.splitlines() if l.startswith("VmRSS:")).split()[1]) << 10

    before = rss()
    r = post(fusion, {"code": "truncate -s 256M big", "language": "bash",
                      "fetch_files": ["big", "./big", "././big", "./././big"]}, timeout=120)
    assert r.status_code == 200 and len(r.content) < 1 << 20, (r.status_code, len(r.content))
    body = r.json()
    assert body["status"] == "SandboxError" and "16 MiB" in body["message"], body["message"]
    assert rss() - before < 200 << 20, (before, rss())
    # Under the cap every spelling asked for is answered; a missing file is not.
    r = post(fusion, {"code": "head -c 1000 /dev/urandom > a", "language": "bash",
                      "fetch_files": ["a", "./a", "missing"]})
    files = r.json()["files"]
    assert set(files) == {"a", "./a"} and files["a"] == files["./a"], r.text
    assert len(base64.b64decode(files["a"])) == 1000
    wait_no_fusion_sandboxes(w)


def test_web_pages_of_other_origins_cannot_run_code(fusion):
    """What a page the operator opens can send without a CORS preflight (a
    text/plain or form body, from its own origin) runs nothing."""
    code = b'{"code": "print(1)"}'
    url = fusion.url + "/run_code"
    for headers, status in [
        ({"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
        ({"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403),
    ]:
        r = httpx.post(url, content=code, headers=headers)
        assert r.status_code == status and r.json()["detail"], (headers, r.status_code, r.text)
    assert fusion_sandboxes(fusion.warren) == []
    # Its own origin, and a program's request without a type, as FastAPI reads them.
    own = fusion.url.replace("http://", "")
    r = httpx.post(url, content=code, headers={"Content-Type": "application/json", "Origin": fusion.url, "Host": own},
                   timeout=60)
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "1\n", r.text
    r = httpx.post(url, content=code, timeout=60)
    assert "content-type" not in r.request.headers
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "1\n", r.text


def test_a_door_with_a_token_takes_only_calls_that_carry_it(images):
    port = free_port()
    with own_daemon(images, args=["--sandbox-fusion", f"127.0.0.1:{port}"],
                    env={"WARREN_SANDBOX_FUSION_TOKEN": "fusion-s3cret"}) as w:
        url = f"http://127.0.0.1:{port}/run_code"
        for auth in (None, "Bearer wrong", "fusion-s3cret"):
            r = httpx.post(url, json={"language": "python"}, headers={"Authorization": auth} if auth else {})
            assert r.status_code == 401 and "Authorization: Bearer" in r.json()["detail"], r.text
        # With the token the call gets as far as the request's own check.
        r = httpx.post(url, json={"language": "python"}, headers={"Authorization": "Bearer fusion-s3cret"})
        assert r.status_code == 422 and "code" in r.text, r.text
        assert w.http.get("/v1/sandboxes").json() == []
        # Issue 39 (5): its image (the default) is in no store: said at start.
        wait_until(lambda: "SandboxFusion image python:3.11-slim is not in the image store" in w.log_text(),
                   what="the warning about the missing image")


def test_a_door_opened_for_a_tenant_makes_that_tenants_sandboxes(images, tmp_path):
    """--sandbox-fusion-tenant: a verl run's sandboxes count against its
    tenant's quota and fair share, and are that tenant's."""
    image_tar = debian_archive(tmp_path, ("python3",))
    port = free_port()
    with own_daemon(images, args=["--sandbox-fusion", f"127.0.0.1:{port}", "--sandbox-fusion-image", IMAGE,
                                  "--sandbox-fusion-tenant", "team-rl"]) as w:
        w.cli("image", "import", str(image_tar), "--name", IMAGE, timeout=300)
        url = f"http://127.0.0.1:{port}/run_code"
        body = {"code": "print(1)", "language": "python"}
        # Before the tenant exists the door says so, and makes nothing.
        r = httpx.post(url, json=body, timeout=60).json()
        assert r["status"] == "SandboxError" and "team-rl" in r["message"], r
        assert w.http.get("/v1/sandboxes", params={"all": "true"}).json() == []
        w.cli("tenant", "create", "team-rl", "--sandboxes", "2")
        r = httpx.post(url, json=body, timeout=60).json()
        assert r["status"] == "Success" and r["run_result"]["stdout"] == "1\n", r
        made = w.http.get("/v1/sandboxes", params={"all": "true", "label": FRONT}).json()
        assert [s["tenant"] for s in made] == ["team-rl"], made


def test_missing_toolchain_names_the_binary_and_the_flag(fusion):
    # The test image has no Go: the answer says so, and how to fix it.
    r = post(fusion, {"code": "package main\nfunc main() {}", "language": "go"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "SandboxError", body
    assert "go" in body["message"] and "--sandbox-fusion-image" in body["message"], body
    assert body["compile_result"]["status"] == "Error" and body["run_result"] is None


def test_cpp_compiles_runs_and_reports_compile_errors(fusion):
    ok = post(fusion, {"code": "#include <iostream>\nint main() { int a, b; std::cin >> a >> b; std::cout << a * b << std::endl; }",
                       "language": "cpp", "stdin": "6 7"}).json()
    assert ok["status"] == "Success", json.dumps(ok)[:3000]
    assert ok["compile_result"]["return_code"] == 0 and ok["run_result"]["stdout"] == "42\n", ok
    bad = post(fusion, {"code": "int main() { return undefined_name; }", "language": "cpp"}).json()
    assert bad["status"] == "Failed", bad
    assert bad["compile_result"]["status"] == "Finished" and bad["compile_result"]["return_code"] != 0, bad
    assert "undefined_name" in bad["compile_result"]["stderr"] and bad["run_result"] is None, bad


def test_memory_limit_kills_a_program_over_it(fusion):
    hog = "x = bytearray(400 * 1024 * 1024); print(len(x))"
    small = post(fusion, {"code": hog, "memory_limit_MB": 128}).json()
    assert small["status"] == "Failed", small
    assert small["run_result"]["return_code"] != 0
    big = post(fusion, {"code": hog, "memory_limit_MB": 1024}).json()
    assert big["status"] == "Success", big


def test_verl_reward_helper(clients, fusion):
    out = client(clients, fusion, """
        m = verl()
        run_url = url + "/run_code"
        def case(code, stdin, expected, timeout=3):
            return m._process_single_case(0, stdin, expected, run_url, code, timeout, 1024, "python")
        ok, _ = case("a, b = map(int, input().split())\\nprint(a + b)", "1 2", "3")
        wrong, _ = case("print(4)", "", "3")
        _, slow = case("import time\\ntime.sleep(10)", "", "", timeout=1)
        _, crash = case("raise SystemExit(1)", "", "")
        res, meta = m.check_correctness(run_url, {"inputs": ["1 2", "5 5"], "outputs": ["3", "10"]},
                                        "a, b = map(int, input().split())\\nprint(a + b)", timeout=5)
        bad_cpp, cpp_meta = m._process_single_case(0, "", "", run_url, "int main() { return nope; }", 10, 1024, "cpp")
        good_cpp, _ = m._process_single_case(0, "", "1", run_url, "#include <cstdio>\\nint main() { puts(\\"1\\"); }", 10, 1024, "cpp")
        no_go = m._process_single_case(0, "", "", run_url, "package main\\nfunc main() {}", 3, 1024, "go")
        print(json.dumps({"ok": ok, "wrong": wrong, "slow": slow["status"], "crash": crash["status"],
                          "check": res, "cpp": [bad_cpp, cpp_meta["status"], good_cpp],
                          "go": [no_go[0], no_go[1]["status"]]}))
    """)
    assert out["ok"] is True and out["wrong"] is False, out
    assert out["slow"] == "timeout" and out["crash"] == "runtime_error", out
    assert out["check"] == [True, True], out
    # verl scores a compile error -4 (its own code) and says why.
    assert out["cpp"] == [-4, "compile_error", True], out
    # No Go in the test image: verl counts the sandbox's error as -1.
    assert out["go"] == [-1, "sandbox_error"], out


@pytest.mark.serial  # 256 sandboxes at once: starves the tests beside it
def test_256_concurrent_requests(fusion):
    w = fusion.warren

    def one(i):
        r = post(fusion, {"code": f"print({i} * 2)"}, timeout=300)
        return r.status_code, r.json() if r.status_code == 200 else r.text

    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=256) as pool:
        results = list(pool.map(one, range(256)))
    elapsed = time.time() - started
    bad = [(i, r) for i, r in enumerate(results) if r[0] != 200 or r[1]["status"] != "Success"]
    assert bad == [], bad[:3]
    assert [r[1]["run_result"]["stdout"] for r in results] == [f"{i * 2}\n" for i in range(256)]
    print(f"256 concurrent /run_code: {elapsed:.1f} s")
    wait_no_fusion_sandboxes(w, timeout=10)


def test_client_gone_mid_request_destroys_its_sandbox(fusion):
    w = fusion.warren
    body = json.dumps({"code": "import time; time.sleep(120)", "run_timeout": 120}).encode()
    port = int(fusion.url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    deadline = time.time() + 30
    while time.time() < deadline:
        live = [x for x in fusion_sandboxes(w) if x["state"] == "running"]
        if live:
            break
        time.sleep(0.1)
    assert live, "the request's sandbox never ran"
    # The program runs in it now; the client goes away.
    time.sleep(0.5)
    s.close()
    started = time.time()
    wait_no_fusion_sandboxes(w, timeout=20)
    assert time.time() - started < 15
    r = w.http.get(f"/v1/sandboxes/{live[0]['id']}")
    assert r.json()["state"] == "destroyed", r.text


# SandboxFusion's own tests of /run_jupyter (sandbox/tests/runners/test_jupyter.py)
JUPYTER_CELLS = ['a = "hello"', 'a', 'print(a)',
                 'import sys\nsys.stderr.write("This is an error message\\n")', 'assert False',
                 'import os; os.system("echo from-a-child")', 'print(a)']


def check_jupyter_cells(cells):
    assert len(cells) == len(JUPYTER_CELLS), cells
    assert cells[0]["stdout"] == "" and cells[0]["error"] == []
    assert cells[1]["display"][0]["text/plain"] == "'hello'"
    assert cells[2]["stdout"] == "hello\n"
    assert cells[3]["stderr"] == "This is an error message\n"
    assert cells[4]["error"][0]["ename"] == "AssertionError", cells[4]
    assert any("assert False" in line or "AssertionError" in line for line in cells[4]["error"][0]["traceback"])
    assert "from-a-child" in cells[5]["stdout"], cells[5]
    # An error does not stop the cells after it.
    assert cells[6]["stdout"] == "hello\n"


def test_run_jupyter_with_the_client(clients, fusion):
    out = client(clients, fusion, f"""
        from sandbox_fusion import RunJupyterRequest, run_jupyter, set_endpoint
        set_endpoint(url)
        ok = json.loads(run_jupyter(RunJupyterRequest(cells={JUPYTER_CELLS!r},
            files={{"data.txt": "NDI="}}, fetch_files=["out.txt"])).json())
        state = json.loads(run_jupyter(RunJupyterRequest(cells=[
            "print(open('data.txt').read())", "open('out.txt', 'w').write('done')"],
            files={{"data.txt": "NDI="}}, fetch_files=["out.txt"])).json())
        slow = json.loads(run_jupyter(RunJupyterRequest(cells=["import time; time.sleep(30)"],
            total_timeout=2)).json())
        print(json.dumps({{"ok": ok, "state": state, "slow": slow}}))
    """)
    ok = out["ok"]
    assert ok["status"] == "Success", json.dumps(ok)[:3000]
    # The image has ipykernel: a real Jupyter kernel ran the cells.
    assert "(Jupyter)" in ok["driver"]["stdout"], ok["driver"]
    check_jupyter_cells(ok["cells"])
    state = out["state"]
    assert state["status"] == "Success", state
    assert state["cells"][0]["stdout"] == "42\n"
    assert state["files"] == {"out.txt": base64.b64encode(b"done").decode()}
    slow = out["slow"]
    assert slow["status"] == "Failed" and slow["cells"] == [], slow
    assert slow["driver"]["status"] == "TimeLimitExceeded", slow["driver"]
    wait_no_fusion_sandboxes(fusion.warren)


def test_run_jupyter_bad_requests(fusion):
    r = httpx.post(fusion.url + "/run_jupyter", json={"cells": ["1"], "kernel": "julia"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "kernel"], r.text
    r = httpx.post(fusion.url + "/run_jupyter", json={"code": "1"})
    assert r.status_code == 422 and "cells" in r.text, r.text


def test_jupyter_driver_without_jupyter(tmp_path):
    """Warren's own kernel in the driver, for images without Jupyter: the
    same answers to SandboxFusion's cells, and a cell time-out. Run with
    the host's python3 without site packages (so without ipykernel)."""
    driver = ROOT / "crates" / "warren-fusion" / "src" / "jupyter_driver.py"
    work = tmp_path / "work"
    (work / "tmp" / "sandbox" / "configs").mkdir(parents=True)
    shutil.copy(driver, work / "driver.py")

    def run_cells(cells, cell_timeout=0):
        (work / "tmp/sandbox/configs/input.json").write_text(json.dumps(
            {"kernel": "python3", "cells": cells, "cell_timeout": cell_timeout, "total_timeout": 45}))
        p = subprocess.run(["python3", "-S", "driver.py"], cwd=work, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "built-in Python kernel" in p.stdout, p.stdout
        return json.loads((work / "tmp/sandbox/configs/output.json").read_text())

    out = run_cells(JUPYTER_CELLS)
    assert out["status"] == "Finished"
    check_jupyter_cells(out["cells"])
    out = run_cells(["x = 1", "import time; time.sleep(10)", "print(x)"], cell_timeout=0.5)
    assert out["status"] == "TimeLimitExceeded" and len(out["cells"]) == 2, out
