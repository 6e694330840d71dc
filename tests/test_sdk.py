"""The Python SDK (sdk/python, import name `warren`) against a real daemon,
through the SDK only: the sync client here, the async one in
test_sdk_async.py. The daemon fixture is called `warren` (conftest), so the
SDK is imported as `sdk`."""

import dataclasses
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import typing
from pathlib import Path

import httpx
import pytest

import warren as sdk
from warren import _core as core
from warren import models
from conftest import UP_ARGS, own_daemon
from helpers import uniq, wait_until

ROOT = Path(__file__).resolve().parent.parent
SDK = ROOT / "sdk" / "python"


@pytest.fixture(scope="module")
def client(warren):
    with sdk.Client(warren.url, token=warren.token) as c:
        yield c


@pytest.fixture
def sb(client):
    with client.sandbox(image="busybox:latest", memory="64M", labels={"t": uniq()}) as s:
        yield s


# ---------------------------------------------------------------- contract


# model -> schema in /openapi.json
MODELS = {
    models.SandboxSpec: "SandboxSpec",
    models.ForkOrigin: "ForkOrigin",
    models.NetworkSpec: "NetworkSpec",
    models.SandboxInfo: "SandboxInfo",
    models.ResolvedResources: "ResolvedResources",
    models.Usage: "Usage",
    models.Event: "Event",
    models.BatchInfo: "BatchInfo",
    models.BatchFailure: "BatchFailure",
    models.NetworkChange: "NetworkChange",
    models.Node: "NodeInfo",
    models.NodeLoad: "NodeLoad",
    models.Resources: "Resources",
    models.DeviceClass: "DeviceClass",
    models.Profile: "Profile",
    models.ProfileRequest: "Request",
    models.ProfileRun: "Run",
    models.ProfileDetail: "ProfileDetail",
    models.PrewarmResult: "PrewarmResult",
    models.PrewarmNode: "PrewarmNode",
    models.PathEntry: "PathEntry",
    models.Volume: "VolumeInfo",
    models.VolumeMount: "VolumeMount",
    models.Secret: "SecretInfo",
    models.SecretRef: "SecretRef",
    models.Quota: "Quota",
    models.TenantUsage: "TenantUsage",
    models.Tenant: "TenantInfo",
    models.Token: "TokenInfo",
    models.NewToken: "NewToken",
    models.WhoAmI: "WhoAmI",
    models.AuditEntry: "AuditEntry",
}


@pytest.mark.smoke  # SDK
def test_models_follow_openapi(client):
    doc = client.openapi()
    schemas = doc["components"]["schemas"]
    def props_of(schema):
        # A struct that flattens another is an allOf of both.
        if "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
        parts = [schema] + schema.get("allOf", [])
        return {k: v for p in parts for k, v in (props_of(p) if p is not schema else p.get("properties", {})).items()}

    def required_of(schema):
        if "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
        return set(schema.get("required", [])).union(*(required_of(p) for p in schema.get("allOf", [])))

    for model, name in MODELS.items():
        props = props_of(schemas[name])
        fields = {f.name for f in dataclasses.fields(model) if f.name != "raw"}
        assert fields == set(props), f"{model.__name__} vs {name}: only model {fields - set(props)}, only API {set(props) - fields}"
        # A field the model cannot do without must be one the API always sends.
        required = required_of(schemas[name])
        needed = {f.name for f in dataclasses.fields(model) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        assert needed <= required, (name, needed - required)
    # Enums: states, error codes, exec event types.
    assert set(typing.get_args(models.SandboxState)) == set(schemas["SandboxState"]["enum"])
    assert set(sdk.errors.ERROR_CLASSES) == set(schemas["ErrorCode"]["enum"])
    variants = {v["properties"]["type"]["enum"][0]: set(v["properties"]) - {"type"} for v in schemas["ExecEvent"]["oneOf"]}
    assert set(variants) == {"start", "stdout", "stderr", "exit", "keepalive", "error"}
    assert variants["exit"] == {f.name for f in dataclasses.fields(models.ExecExit)} - {"type"}
    assert variants["start"] == {f.name for f in dataclasses.fields(models.ExecStart)} - {"type"}
    assert set(typing.get_args(models.PathKind)) == set(schemas["PathKind"]["enum"])
    ops = {v["properties"]["op"]["enum"][0] for v in schemas["PathOp"]["oneOf"]}
    assert ops == {"stat", "list", "make_dir", "make_dir_as", "rename", "remove", "set_attrs"}, ops
    # Every path the SDK calls exists with that method.
    for method, path in [
        ("post", "/v1/sandboxes"), ("get", "/v1/sandboxes/{id}"), ("post", "/v1/sandboxes/{id}/exec"),
        ("put", "/v1/sandboxes/{id}/files"), ("post", "/v1/sandboxes/{id}/paths"), ("patch", "/v1/sandboxes/{id}/network"),
        ("post", "/v1/sandboxes/{id}/commit"), ("post", "/v1/sandboxes/{id}/fork"), ("post", "/v1/images/prewarm"), ("post", "/v1/images/pull"),
        ("get", "/v1/events"), ("post", "/v1/profiles/import"), ("post", "/v1/batches"),
    ]:
        assert method in doc["paths"][path], (method, path)


def public(cls):
    return {
        n: m for n, m in inspect.getmembers(cls) if not n.startswith("_") and (callable(m) or isinstance(m, property))
    }


@pytest.mark.parametrize(
    "sync_cls,async_cls",
    [
        (sdk.Client, sdk.AsyncClient),
        (sdk.Sandbox, sdk.AsyncSandbox),
        (sdk.Files, sdk.AsyncFiles),
        (sdk.Port, sdk.AsyncPort),
        (sdk.Batch, sdk.AsyncBatch),
        (sdk.Process, sdk.AsyncProcess),
        (sdk._sync.Sandboxes, sdk._async.AsyncSandboxes),
        (sdk._sync.Images, sdk._async.AsyncImages),
        (sdk._sync.Profiles, sdk._async.AsyncProfiles),
        (sdk._sync.Batches, sdk._async.AsyncBatches),
        (sdk._sync.Secrets, sdk._async.AsyncSecrets),
    ],
)
def test_sync_and_async_have_the_same_surface(sync_cls, async_cls):
    s, a = public(sync_cls), public(async_cls)
    allowed_only_sync = {"__iter__", "__next__", "iter"}  # Process is also an iterator in sync code
    only_sync = set(s) - set(a) - allowed_only_sync
    if sync_cls is sdk.Process:  # the sync Process is an ExecStream too
        only_sync -= set(public(sdk.ExecStream))
    assert not only_sync, only_sync
    assert not set(a) - set(s) - {"aclose"}, set(a) - set(s)
    for name in set(s) & set(a):
        if isinstance(s[name], property):
            continue
        ps = list(inspect.signature(s[name]).parameters)
        pa = list(inspect.signature(a[name]).parameters)
        assert ps == pa, (sync_cls.__name__, name, ps, pa)


@pytest.mark.skipif(bool(UP_ARGS), reason="a static check; run once")
def test_mypy_strict_on_package_and_examples():
    pytest.importorskip("mypy")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "src/warren", "examples"],
        cwd=SDK,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------- exec


def test_exec_result_fields_env_cwd_stdin(sb):
    r = sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.stdout_text, r.stderr_text) == (3, b"out\n", b"err\n", "out\n", "err\n")
    assert not r.ok and r.duration >= 0 and r.exec_id.startswith("ex-") and r.pid > 0
    r = sb.exec(["sh", "-c", 'echo "$A:$(pwd)"; cat'], env={"A": "x y"}, cwd="/tmp", stdin=b"\x00in\xff")
    assert r.stdout == b"x y:/tmp\n\x00in\xff" and r.ok
    with pytest.raises(sdk.CommandFailed) as e:
        sb.exec("echo bad >&2; exit 4", check=True)
    assert e.value.exit_code == 4 and e.value.stderr == b"bad\n"
    t = time.monotonic()
    with pytest.raises(sdk.ExecTimeout) as e:
        sb.exec("echo partial; sleep 30", timeout=0.5)
    assert time.monotonic() - t < 10
    assert e.value.result.timed_out and e.value.result.exit_code == 137 and e.value.stdout == b"partial\n"
    r = sb.exec("sleep 30", timeout="300ms", raise_on_timeout=False)
    assert r.timed_out and not r.ok


def test_exec_stream_interleaves_stdout_stderr_and_binary(sb):
    script = "printf 'a\\000\\377'; sleep 0.2; printf 'b' >&2; sleep 0.2; printf 'c'; sleep 0.2; printf '\\001' >&2"
    with sb.exec_stream(script) as s:
        events = list(s)
    assert isinstance(events[0], models.ExecStart) and events[0].pid > 0
    assert isinstance(events[-1], models.ExecExit) and events[-1].code == 0
    out = [(e.stream, e.data) for e in events if isinstance(e, models.ExecOutput)]
    assert out == [("stdout", b"a\x00\xff"), ("stderr", b"b"), ("stdout", b"c"), ("stderr", b"\x01")]
    assert s.result.stdout == b"a\x00\xffc" and s.result.stderr == b"b\x01"
    # All 256 byte values survive.
    r = sb.exec("i=0; while [ $i -lt 256 ]; do printf \"\\\\$(printf %o $i)\"; i=$((i+1)); done")
    assert r.stdout == bytes(range(256))


def test_closing_an_exec_stream_kills_the_command(sb):
    s = sb.exec_stream("echo started; sleep 77; echo never")
    first = [next(s), next(s)]
    assert isinstance(first[1], models.ExecOutput) and first[1].data == b"started\n"
    s.close()
    deadline = time.time() + 10
    while "sleep 77" in sb.exec("ps").stdout_text:
        assert time.time() < deadline, "the command outlived its stream"
        time.sleep(0.1)
    with pytest.raises(sdk.StreamError):
        s.result


def test_background_process_wait_kill_and_stdin(sb):
    p = sb.spawn("echo up; sleep 0.3; echo down >&2; exit 5")
    assert p.pid and p.pid > 0
    r = p.wait()
    assert (r.exit_code, r.stdout, r.stderr) == (5, b"up\n", b"down\n")

    p = sb.spawn("sleep 88")
    assert "sleep 88" in sb.exec("ps").stdout_text
    p.kill()
    assert p.wait().exit_code == 137 and p.returncode == 137
    deadline = time.time() + 10
    while "sleep 88" in sb.exec("ps").stdout_text:
        assert time.time() < deadline, "kill left the process running"
        time.sleep(0.1)

    p = sb.spawn(["sh", "-c", "while read l; do echo got:$l; done; echo eof"], stdin=True)
    p.send_stdin("one\n")
    p.send_stdin(b"two\n")
    p.close_stdin()
    r = p.wait(check=True)
    assert r.stdout == b"got:one\ngot:two\neof\n", r
    with pytest.raises(sdk.WarrenError):
        sb.spawn("true").send_stdin("x")
    # An exec stream takes stdin as it runs, too (no shell needed).
    with sb.exec_stream(["cat"], stdin="a", stdin_open=True) as s:
        next(iter(s))
        s.send_stdin("b")
        s.close_stdin()
        for _ in s:
            pass
        assert s.result.stdout == b"ab" and s.result.exit_code == 0, s.result
    # A terminal, typed into at once (as docs/python.md writes it): the
    # first send waits for the command to start; no event is lost.
    with sb.exec_stream("sh", tty=True, stdin_open=True) as s:
        s.send_stdin("echo $((6 * 7))\n")
        s.resize(50, 160)
        s.send_stdin("exit\n")
        events = list(s)
    assert isinstance(events[0], sdk.ExecStart), events[:2]
    out = b"".join(ev.data for ev in events if isinstance(ev, sdk.models.ExecOutput))
    assert b"42" in out and s.result.exit_code == 0, out


# ---------------------------------------------------------------- files


def test_files(sb, tmp_path):
    sb.files.write("/tmp/a.bin", b"\x00\x01binary", mode=0o600)
    sb.files.write("/tmp/t.txt", "text")
    sb.files.write("/tmp/it.txt", iter([b"chunk1-", b"chunk2"]))
    assert sb.files.read("/tmp/a.bin") == b"\x00\x01binary"
    assert sb.files.read_text("/tmp/it.txt") == "chunk1-chunk2"
    entries = {e.name: e for e in sb.files.list("/tmp")}
    assert entries["a.bin"].kind == "file" and entries["a.bin"].size == 8 and entries["a.bin"].mode == 0o600
    assert sb.files.exists("/tmp/t.txt") and not sb.files.exists("/tmp/nope")
    sb.files.remove("/tmp/t.txt")
    assert not sb.files.exists("/tmp/t.txt")
    with pytest.raises(sdk.NotFound):
        sb.files.read("/tmp/t.txt")

    src = tmp_path / "src"
    (src / "sub" / "deep").mkdir(parents=True)
    (src / "top.txt").write_text("top")
    (src / "sub" / "deep" / "x.bin").write_bytes(os.urandom(70_000))
    os.chmod(src / "sub" / "deep" / "x.bin", 0o750)
    os.symlink("top.txt", src / "link")
    sb.files.upload_dir(src, "/work/proj")
    assert sb.exec("cat /work/proj/link; ls -l /work/proj/sub/deep/x.bin").stdout_text.startswith("top-rwxr-x---")
    dst = tmp_path / "dst"
    sb.files.download_dir("/work/proj", dst)
    assert (dst / "top.txt").read_text() == "top"
    assert (dst / "sub" / "deep" / "x.bin").read_bytes() == (src / "sub" / "deep" / "x.bin").read_bytes()
    assert os.readlink(dst / "link") == "top.txt"
    sb.files.remove("/work/proj")
    assert not sb.files.exists("/work/proj")

    local = tmp_path / "up.txt"
    local.write_bytes(b"uploaded")
    os.chmod(local, 0o640)
    sb.files.upload(local, "/tmp/up.txt")
    sb.files.download("/tmp/up.txt", tmp_path / "down.txt")
    assert (tmp_path / "down.txt").read_bytes() == b"uploaded"
    assert sb.exec("stat -c %a /tmp/up.txt").stdout_text.strip() == "640"


def test_files_paths(sb):
    sb.exec("mkdir -p /p/a/b && printf 12345 > /p/a/f && ln -s /etc /p/a/etc && ln -s /nowhere /p/dangling", check=True)
    f = sb.files.stat("/p/a/f")
    assert isinstance(f, models.PathEntry)
    assert (f.path, f.name, f.kind, f.size, f.mode, f.uid, f.gid) == ("/p/a/f", "f", "file", 5, 0o644, 0, 0)
    assert f.is_file and not f.is_dir and f.symlink_target is None
    assert int(f.modified.timestamp()) == int(sb.exec("stat -c %Y /p/a/f").stdout_text)
    link = sb.files.stat("/p/a/etc")
    assert link.is_symlink and link.symlink_target == "/etc"
    assert sb.files.stat("/").path == "/" and sb.files.stat("/").name == "/"
    with pytest.raises(sdk.NotFound):
        sb.files.stat("/p/nope")
    # exists: anything there, a dangling link too; not what is missing.
    assert sb.files.exists("/p/a") and sb.files.exists("/p/dangling") and not sb.files.exists("/p/nope")

    assert sorted(e.name for e in sb.files.list("/p/a")) == ["b", "etc", "f"]
    deep = {e.path: e.kind for e in sb.files.list("/p", depth=3)}
    assert deep == {"/p/a": "dir", "/p/a/b": "dir", "/p/a/f": "file", "/p/a/etc": "symlink", "/p/dangling": "symlink"}
    with pytest.raises(ValueError):
        sb.files.list("/p", depth=0)
    with pytest.raises(sdk.BadRequest):
        sb.files.list("/p/a/f")

    made = sb.files.mkdir("/p/new/deeper")
    assert made.is_dir and made.path == "/p/new/deeper"
    with pytest.raises(sdk.Conflict):
        sb.files.mkdir("/p/new/deeper")

    # chmod/chown: ids as the sandbox sees them; a link's own owner.
    changed = sb.files.set_attrs("/p/a/f", uid=1000, gid=1001, mode=0o600)
    assert (changed.uid, changed.gid, changed.mode) == (1000, 1001, 0o600), changed
    assert sb.exec("stat -c '%u %g %a' /p/a/f").stdout_text == "1000 1001 600\n"
    assert sb.files.set_attrs("/p/a/etc", uid=7).uid == 7 and sb.files.stat("/etc").uid == 0

    moved = sb.files.rename("/p/a", "/q/r/a")
    assert moved.is_dir and moved.path == "/q/r/a"
    assert sb.files.read_text("/q/r/a/f") == "12345" and not sb.files.exists("/p/a")
    with pytest.raises(sdk.NotFound):
        sb.files.rename("/p/a", "/elsewhere")

    assert sb.files.remove("/q") is None
    assert not sb.files.exists("/q")
    assert sb.exec("cat /etc/hostname").stdout_text == "warren-busybox\n"  # the link went, not /etc
    with pytest.raises(sdk.NotFound):
        sb.files.remove("/q")


ROUND_TRIP = r"""
import hashlib, os, resource, sys, warren
size = 100 << 20
src, dst = sys.argv[1], sys.argv[2]
with open(src, "wb") as f:
    block = os.urandom(1 << 20)
    for i in range(100):
        f.write(block[i:] + block[:i])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with warren.Client() as c, c.sandbox(image="busybox:latest", memory="64M") as sb:
    sb.files.upload(src, "/tmp/big")
    sb.files.download("/tmp/big", dst)
    remote = sb.exec("md5sum /tmp/big").stdout_text.split()[0]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
h = lambda p: hashlib.md5(open(p, "rb").read()).hexdigest()
print(base, peak, h(src) == h(dst) == remote, os.path.getsize(dst))
"""


def test_100mb_round_trip_streams_without_holding_the_file(warren, tmp_path):
    env = {**os.environ, "WARREN_URL": warren.url, "WARREN_TOKEN": warren.token}
    t = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, str(tmp_path / "src"), str(tmp_path / "dst")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    base, peak, same, size = out.stdout.split()
    assert same == "True" and int(size) == 100 << 20
    grown_mib = (int(peak) - int(base)) / 1024
    print(f"100 MiB round trip: {time.monotonic() - t:.1f}s, peak RSS grew {grown_mib:.1f} MiB")
    assert grown_mib < 40, f"peak RSS grew {grown_mib:.0f} MiB for a 100 MiB round trip"


# ---------------------------------------------------------------- lifecycle


def test_pause_resume_ttl_heartbeat_logs_usage(client, sb):
    assert sb.pause().state == "paused"
    with pytest.raises(sdk.Conflict):
        sb.exec("true")
    assert sb.resume().state == "running"
    info = sb.set_ttl("1h")
    assert 3_500_000 < info.ttl_remaining_ms <= 3_600_000
    assert sb.set_ttl(120).ttl_remaining_ms <= 120_000
    assert sb.heartbeat().id == sb.id
    assert sb.set_reclaim("keep_on_failure", keep_for="10m").spec.reclaim == "keep_on_failure"
    sb.exec("echo logged; echo warned >&2")
    lines = sb.logs()
    assert any(l.kind == "stdout" and l.output == b"logged\n" for l in lines)
    assert any(l.kind == "stderr" and l.output == b"warned\n" for l in lines)
    assert any(l.kind == "event" and l.reason == "paused" for l in lines)
    u = sb.usage()
    assert u.cpu_usage_ns > 0 and u.memory_bytes > 0
    assert [e.reason for e in sb.refresh().events][:2] == ["created", "ready"]
    # What the control plane keeps: the usage history, and the log by label
    # within a window (a line written just now is in it, shipped or not).
    history = wait_until(sb.usage_history, what="a usage sample kept")
    assert history[0].sandbox_id == sb.id and history[0].time_ms > 0, history
    sb.exec("echo just-now")
    recent = list(client.logs(sb.labels, since=60))
    assert any(l.output == b"just-now\n" for l in recent), recent
    assert all(l.sandbox_id == sb.id for l in recent)


def test_context_manager_destroys_and_honours_keep_on_failure(client):
    with client.sandbox(image="busybox:latest", memory="32M") as s:
        assert s.state == "running"
    assert client.sandboxes.get(s.id).state == "destroyed"
    with pytest.raises(RuntimeError):
        with client.sandbox(image="busybox:latest", memory="32M", reclaim="keep_on_failure", ttl="2m") as kept:
            raise RuntimeError("episode failed")
    assert client.sandboxes.get(kept.id).state == "running"  # left for inspection
    kept.destroy()
    assert kept.info.state == "destroyed"


def test_lease_keeper_keeps_a_short_lease_alive_and_without_it_it_expires(client):
    tag = uniq()
    kept = client.sandbox(image="busybox:latest", memory="32M", lease="1500ms", labels={"lk": tag})
    loose = client.sandbox(image="busybox:latest", memory="32M", lease="1500ms", labels={"lk": tag}, keep_alive=False)

    def state(sb):
        # Listing does not renew leases (a GET of the sandbox would).
        (info,) = [s.info for s in client.sandboxes.list({"lk": tag}, all=True) if s.id == sb.id]
        return info

    try:
        time.sleep(4)
        assert state(kept).state == "running"
        deadline = time.time() + 10
        while state(loose).state != "destroyed":
            assert time.time() < deadline, "the unkept sandbox did not expire"
            time.sleep(0.2)
        assert state(loose).reason == "lease_expired"
        kept.keep_alive(False)
        deadline = time.time() + 10
        while state(kept).state != "destroyed":
            assert time.time() < deadline, "turning the keeper off did not let it expire"
            time.sleep(0.2)
        assert state(kept).reason == "lease_expired"
    finally:
        kept.destroy()
        loose.destroy()


def test_labels_get_list_delete(client):
    tag = uniq()
    made = [client.sandbox(image="busybox:latest", memory="32M", labels={"sdk": tag, "i": str(i)}) for i in range(3)]
    assert {s.id for s in client.sandboxes.list({"sdk": tag})} == {s.id for s in made}
    assert [s.id for s in client.sandboxes.list(f"sdk={tag},i in (1)")] == [made[1].id]
    got = client.sandboxes.get(made[0].id)
    assert got.labels == {"sdk": tag, "i": "0"} and got.info.resources.memory == 32 << 20
    deleted = client.sandboxes.delete({"sdk": tag})
    assert sorted(d.id for d in deleted) == sorted(s.id for s in made)
    assert client.sandboxes.list({"sdk": tag}) == []
    assert len(client.sandboxes.list({"sdk": tag}, all=True)) == 3


def test_run_is_one_request_that_leaves_nothing(client):
    tag = uniq()
    r = client.run("busybox:latest", "read x; echo got $x; echo e >&2; exit 4", stdin=b"in\n", labels={"sdk": tag}, memory="32M")
    assert (r.exit_code, r.stdout, r.stderr) == (4, b"got in\n", b"e\n")
    # It returns once the sandbox is gone.
    (gone,) = client.sandboxes.list({"sdk": tag}, all=True)
    assert (gone.state, gone.info.reason, gone.info.exit_code) == ("destroyed", "run_ended", 4)
    with pytest.raises(sdk.CommandFailed):
        client.run("busybox:latest", ["false"], check=True)
    with pytest.raises(sdk.ExecTimeout):
        client.run("busybox:latest", "sleep 30", timeout=0.3)
    with pytest.raises(sdk.BadRequest):
        client.run("busybox:latest", ["true"], memory="1M")


def test_commit_makes_an_image(client, sb):
    sb.exec("echo committed > /marker", check=True)
    name = f"sdk-commit-{uniq()}:v1"
    img = sb.commit(name)
    assert img.name == name and img.digest.startswith("sha256:")
    assert name in [i.name for i in client.images.list()]
    with client.sandbox(image=name, memory="32M") as s2:
        assert s2.exec("cat /marker").stdout == b"committed\n"
    assert client.images.delete(name).name == name


def test_port_http_and_tunnel(client):
    cmd = "mkdir -p /www && echo inside > /www/index.html && exec httpd -f -p 8000 -h /www"
    with client.sandbox(image="busybox:latest", memory="32M", cmd=["sh", "-c", cmd]) as s:
        port = s.port(8000)
        deadline = time.time() + 10
        while True:
            try:
                r = port.get("/index.html")
                if r.status_code == 200:
                    break
            except sdk.Conflict:
                pass
            assert time.time() < deadline, "httpd did not come up"
            time.sleep(0.1)
        assert r.text == "inside\n" and port.url.endswith(f"/v1/sandboxes/{s.id}/ports/8000/")
        assert port.post("/index.html", content=b"x").status_code in (200, 405, 501)
        sock = port.connect()
        try:
            sock.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
            got = b""
            while chunk := sock.recv(4096):
                got += chunk
            assert got.startswith(b"HTTP/1.") and got.endswith(b"\r\n\r\ninside\n"), got
        finally:
            sock.close()
        with pytest.raises(sdk.Conflict):
            s.port(9999).connect()
        # For a browser: a link to the port's own host on the ports
        # listener, traded once for that host's cookie (a browser resolves
        # *.localhost itself; here the Host header says it).
        link = port.browser_link()
        m = re.fullmatch(rf"http://(8000-{s.id}\.localhost):(\d+)/\?warren_port_token=([0-9]+\.[0-9a-f]+)", link)
        assert m, link
        host, door = f"{m[1]}:{m[2]}", f"http://127.0.0.1:{m[2]}"
        r = httpx.get(f"{door}/index.html?warren_port_token={m[3]}", headers={"Host": host})
        assert r.status_code == 303 and r.headers["location"] == "/index.html", r.headers
        jar = {"warren_port": r.cookies["warren_port"]}
        r = httpx.get(f"{door}/index.html", headers={"Host": host}, cookies=jar)
        assert (r.status_code, r.text) == (200, "inside\n")
        assert httpx.get(f"{door}/index.html", headers={"Host": host}).status_code == 401
        assert httpx.get(f"{door}/index.html", headers={"Host": host.replace("8000", "8001")},
                         cookies=jar).status_code == 401
        assert httpx.get(f"{door}/index.html?warren_port_token=1.00", headers={"Host": host}).status_code == 401


def test_network_rules(client):
    with client.sandbox(image="busybox:latest", memory="32M", allow=["pypi.org:443"]) as s:
        assert s.info.spec.network.mode == "allowlist" and s.info.spec.network.allow == ["pypi.org:443"]
        change = s.network.set(allow=["example.com:443"], deny=["10.0.0.0/8:443"])
        assert change.sandbox.spec.network.allow == ["example.com:443"] and change.closed == []
        assert s.info.spec.network.deny == ["10.0.0.0/8:443"]
        with pytest.raises(sdk.BadRequest):
            s.network.set(allow=["no-port"])


# ---------------------------------------------------------------- tenants


def test_tenants_tokens_whoami_and_audit(client, warren):
    name = uniq("sdk-team")
    t = client.tenants.create(name, cpu=2, memory="4G", sandboxes=3, weight=2)
    assert (t.name, t.quota.cpu, t.quota.memory, t.quota.sandboxes, t.weight) == (name, 2.0, 4 << 30, 3, 2), t
    tok = client.tokens.create(name, role="admin", description="sdk test")
    assert tok.token and tok.tenant == name and tok.role == "admin"
    assert tok.id in [x.id for x in client.tokens.list()]
    with sdk.Client(warren.url, token=tok.token) as team:
        me = team.whoami()
        assert (me.tenant, me.role, me.token) == (name, "admin", tok.id)
        with team.sandbox(image="busybox:latest", memory="32M") as sb:
            seen = client.tenants.get(name)
            assert seen.usage.sandboxes == 1 and seen.usage.memory > 0, seen
            # The tenant's own audit trail: its create, by its token.
            entries = team.audit(since=60)
            assert any(e.token == tok.id and e.route == "/v1/sandboxes" and e.method == "POST" for e in entries), entries
            assert {e.tenant for e in entries} == {name}
        with pytest.raises(sdk.Forbidden):
            team.tenants.create(uniq("not-mine"))
        assert client.tokens.revoke(tok.id).id == tok.id
        with pytest.raises(sdk.Unauthorized):
            team.whoami()
    assert client.whoami().role == "operator"
    t = client.tenants.set(name, cpu="500m", weight=1)
    assert (t.quota.cpu, t.quota.sandboxes, t.weight) == (0.5, None, 1), t
    client.tenants.remove(name)
    with pytest.raises(sdk.NotFound):
        client.tenants.get(name)


# ---------------------------------------------------------------- fleets


def test_batch_progress_wait_members_and_delete(client):
    tag = uniq()
    b = client.batch(4, image="busybox:latest", memory="32M", cmd="exit 0", labels={"task": tag, "code_version": "v1"})
    seen = []
    info = b.wait(on_progress=seen.append, timeout=60, interval=0.05)
    assert info.submitted == 4 and info.states == {"destroyed": 4}, info
    assert seen and seen[-1].states == {"destroyed": 4} and seen[0].submitted <= seen[-1].submitted
    assert info.failures == [] and info.succeeded == 4
    assert info.cost.cpu_seconds > 0 and info.cost.gpu_seconds == 0, info.cost
    members = b.sandboxes(all=True)
    assert len(members) == 4 and all(m.labels["task"] == tag for m in members)

    bad = client.batch(2, image="busybox:latest", memory="32M", cmd=["sh", "-c", "exit 3"])
    info = bad.wait(timeout=60)
    assert [f.exit_code for f in info.failures] == [3, 3] and info.succeeded == 0

    idle = client.batch(3, image="busybox:latest", memory="32M", labels={"task": tag})
    assert idle.wait(timeout=60).count_in("running") == 3
    assert idle.id in [x.id for x in client.batches.list()]
    assert client.batches.get(idle.id).counts == {"running": 3}
    idle.delete()
    assert idle.refresh().deleted_at is not None
    assert idle.sandboxes() == []


def test_events_follow_and_page(client):
    tag = uniq()
    stream = client.events(follow=True, labels={"ev": tag})
    got = []

    def read():
        for ev in stream:
            got.append(ev)
            if ev.state == "destroyed":
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    time.sleep(0.3)
    with client.sandbox(image="busybox:latest", memory="32M", labels={"ev": tag}) as s:
        pass
    t.join(20)
    stream.close()
    assert not t.is_alive(), got
    assert [(e.sandbox_id, e.reason) for e in got][:2] == [(s.id, "created"), (s.id, "ready")]
    assert got[-1].state == "destroyed"
    assert [e.seq for e in client.events(sandbox=s.id)] == [e.seq for e in got]
    assert [e.reason for e in client.events(sandbox=s.id, type="destroyed")] == ["user_deleted"]


# ---------------------------------------------------------------- images, profiles, nodes


def unique_manifest(layout, tag):
    """Gives `tag` of the OCI layout a manifest of its own (one annotation
    more, the same blobs), so no other image on the shared test daemon has
    its digest: a busybox sandbox another test left behind must not hold it."""
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    for m in index["manifests"]:
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag:
            continue
        blobs = layout / "blobs" / "sha256"
        manifest = json.loads((blobs / m["digest"].split(":", 1)[1]).read_text())
        manifest.setdefault("annotations", {})["dev.warren.test"] = uniq()
        data = json.dumps(manifest).encode()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        m["digest"], m["size"] = f"sha256:{digest}", len(data)
        index_path.write_text(json.dumps(index))
        return
    raise AssertionError(f"no tag {tag} in {index_path}")


def test_images_pull_with_progress_prewarm_and_push(warren, client, images, tmp_path):
    reg_mod = pytest.importorskip("test_registry")
    if not Path(reg_mod.REGISTRY_BIN).exists():
        pytest.skip("docker-registry is not installed")
    from test_registry import Registry, configure, insecure

    reg = Registry()
    try:
        layout = tmp_path / "layout"
        layout.mkdir()
        with tarfile.open(images["oci"]) as t:
            t.extractall(layout)
        unique_manifest(layout, "latest")
        digest = reg.push(layout, "latest", "sdk/busybox:v1")
        configure(warren, insecure(reg))
        progress = []
        img = client.images.pull(f"{reg.host}/sdk/busybox:v1", on_progress=progress.append)
        assert img.digest == digest and img.name == f"{reg.host}/sdk/busybox:v1"
        kinds = [p.type for p in progress]
        assert kinds[0] == "resolved" and kinds[-1] == "done", kinds  # busybox's blobs are stored already
        assert client.images.pull(f"{reg.host}/sdk/busybox:v1").digest == digest
        pre = client.images.prewarm(f"{reg.host}/sdk/busybox:v1")
        assert [n.digest for n in pre.nodes] == [digest]
        pushed = client.images.push(f"{reg.host}/sdk/copy:v2", source=f"{reg.host}/sdk/busybox:v1")
        assert pushed.image.digest == digest
        with client.sandbox(image=f"{reg.host}/sdk/busybox:v1", memory="32M") as s:
            assert s.info.image_digest == digest
        client.images.delete(f"{reg.host}/sdk/busybox:v1")
        assert isinstance(client.images.gc().used_after, int)
    finally:
        reg.stop()


def test_profiles_and_nodes(client):
    task = uniq("prof")
    with client.sandbox(image="busybox:latest", memory="32M", labels={"task": task}) as s:
        s.exec("true")
    deadline = time.time() + 10
    while task not in [p.name for p in client.profiles.list()]:
        assert time.time() < deadline, "no profile recorded"
        time.sleep(0.1)
    detail = client.profiles.get(task)
    assert detail.profile.name == task and detail.profile.runs >= 1 and len(detail.runs) >= 1
    toml = client.profiles.export()
    assert f"[profiles.{task}]" in toml
    edited = toml.replace(f"[profiles.{task}]", f"[profiles.{task}-copy]")
    names = [p.name for p in client.profiles.import_(edited)]
    assert f"{task}-copy" in names
    assert client.profiles.reset(task).runs == 0
    with pytest.raises(sdk.NotFound):
        client.profiles.get(uniq("none"))
    (node,) = client.nodes()
    assert node.allocatable.cpu_millis > 0 and node.allocated.slots >= 0
    assert client.health() == "ok"


# ---------------------------------------------------------------- errors and retries


def test_error_classes_from_the_real_daemon(warren, client, sb):
    with pytest.raises(sdk.NotFound) as e:
        client.sandboxes.get("sbx-nope")
    assert e.value.status == 404 and "sbx-nope" in e.value.message and e.value.code == "not_found"
    with pytest.raises(sdk.InvalidSpec) as e:
        client.sandbox(image="busybox:latest", memory="1K")
    assert e.value.status == 400 and "memory" in e.value.message
    with pytest.raises(TypeError):
        client.sandbox(image="busybox:latest", memroy="1G")
    with pytest.raises(sdk.Unauthorized):
        sdk.Client(warren.url, token="wrong").nodes()
    with pytest.raises(sdk.PayloadTooLarge):
        sb.exec("cat >/dev/null", stdin=b"x" * (33 << 20))
    with pytest.raises(sdk.BadGateway):
        client.images.pull("127.0.0.1:1/none:v1")
    with pytest.raises(sdk.BadGateway):
        client.images.pull("127.0.0.1:1/none:v1", on_progress=lambda ev: None)
    gone = client.sandbox(image="busybox:latest", memory="32M")
    gone.destroy()
    with pytest.raises(sdk.Conflict) as e:
        gone.exec("true")
    assert e.value.status == 409
    with pytest.raises(sdk.TransportError):
        sdk.Client("http://127.0.0.1:1", token="x", max_retries=0).nodes()


def fake(responses, seen):
    def handle(request):
        seen.append((request.method, request.url.path, request.content))
        status, body, headers = responses.pop(0)
        return httpx.Response(status, json=body, headers=headers)

    return httpx.MockTransport(handle)


def err(code, message="m"):
    return {"error": {"code": code, "message": message}}


@pytest.mark.parametrize("code,status", [
    ("too_many_requests", 429), ("no_capacity", 503), ("unavailable", 503), ("internal", 500),
    ("bad_gateway", 502), ("payload_too_large", 413), ("conflict", 409), ("unauthorized", 401),
])
def test_every_error_code_has_its_class(code, status):
    seen = []
    c = sdk.Client("http://warren.test", token="t", transport=fake([(status, err(code, "why"), {"Retry-After": "0"})] * 9, seen), max_retries=0)
    with pytest.raises(sdk.errors.ERROR_CLASSES[code]) as e:
        c.nodes()
    assert (e.value.code, e.value.status, e.value.message) == (code, status, "why")


def test_retries_only_where_safe():
    seen = []
    body = {
        "id": "sbx-1", "state": "running", "reason": "ready", "spec": {"image": "busybox:latest"},
        "resources": {"cpu_millis": 1, "memory": 1, "pids": 1, "disk": 0, "gpus": 0},
        "node": "n", "image_digest": "sha256:x", "created_at": "t",
    }
    c = sdk.Client(
        "http://warren.test", token="t",
        transport=fake([(429, err("too_many_requests"), {"Retry-After": "0"}), (503, err("unavailable"), {"Retry-After": "0"}), (201, body, {})], seen),
    )
    sb = c.sandbox(image="busybox:latest")
    assert sb.id == "sbx-1" and len(seen) == 3
    # The create carried one request id throughout, so a repeat is harmless.
    rids = {json.loads(s[2])["request_id"] for s in seen}
    assert len(rids) == 1 and rids.pop().startswith("py-")
    # Exec is never repeated: the command may have run.
    seen.clear()
    c = sdk.Client("http://warren.test", token="t", transport=fake([(503, err("unavailable"), {"Retry-After": "0"})] * 3, seen))
    with pytest.raises(sdk.Unavailable) as e:
        sdk.Sandbox(c, models.from_json(models.SandboxInfo, body)).exec("true")
    assert len(seen) == 1 and e.value.retry_after == 0


def test_queue_full_is_too_many_requests_and_a_create_retries_until_room(images):
    with own_daemon(images, args=["--max-sandboxes", "1", "--queue-limit", "0"]) as w:
        with sdk.Client(w.url, token=w.token, max_retries=0) as c, sdk.Client(w.url, token=w.token, max_retries=10) as patient:
            first = c.sandbox(image="busybox:latest", memory="32M")
            with pytest.raises(sdk.TooManyRequests) as e:
                c.sandbox(image="busybox:latest", memory="32M")
            assert e.value.retry_after and e.value.retry_after >= 1
            threading.Timer(0.5, first.destroy).start()
            second = patient.sandbox(image="busybox:latest", memory="32M")
            assert second.state == "running"
            second.destroy()


def test_a_token_that_cannot_be_a_header_is_refused_with_what_is_wrong():
    for token in ("…", "abc\n", "two words"):
        with pytest.raises(sdk.WarrenError, match="printable ASCII"):
            sdk.Client("http://127.0.0.1:9", token=token)
