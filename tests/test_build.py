"""`warren build` (POST /v1/builds): real Dockerfiles run step by step in
sandboxes of the daemon, the step cache, `--test`, the errors that name a
Dockerfile line, pushes to a real registry, and the SDK's images.build."""

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import own_daemon


# An index the RUN steps may be allowed to reach (the proxy refuses
# loopback addresses unless a rule names them; this one is named).
INDEX = "127.0.0.13"


@pytest.fixture(scope="module")
def index():
    """A package index stand-in: serves /pkg."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"package-bytes\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer((INDEX, 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


@pytest.fixture(scope="module")
def daemon(images):
    """A daemon of this module's own: its step cache is what these tests
    look at."""
    with own_daemon(images, args=["--net-resolve", f"index.test={INDEX}"]) as w:
        yield w


def context(tmp_path, dockerfile, files=None):
    """A build context directory with a Dockerfile and files."""
    d = tmp_path / f"ctx-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    (d / "Dockerfile").write_text(dockerfile)
    for name, body in (files or {}).items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body) if isinstance(body, str) else p.write_bytes(body)
    return d


def build(w, ctx, *args, check=True):
    """Runs `warren build`; (exit code, stdout, stderr)."""
    p = w.cli("build", *args, str(ctx), check=check, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def run(w, image, *cmd):
    p = w.cli("run", "--rm", "--image", image, "--", *cmd)
    return p.stdout.decode()


def steps(stderr):
    """Each step's instruction and whether it came from the cache."""
    out, current = [], None
    for line in stderr.splitlines():
        if line.startswith("["):
            current = line.split("] ", 1)[1]
        elif line.strip() == "cached" and current:
            out.append((current, True))
            current = None
        elif line.strip().startswith("done in") and current:
            out.append((current, False))
            current = None
    return out


def record(w, name):
    return next(i for i in w.http.get("/v1/images").json() if i["name"] == name)


MULTI_STAGE = """\
ARG BASE=busybox:latest
FROM $BASE AS build
ARG GREETING=hi
ENV APP=/app LEVEL="two words"
WORKDIR $APP
COPY src/ ./
COPY --chmod=750 tool.sh /usr/local/bin/tool
RUN echo "$GREETING from $(pwd)" > made.txt && ls > listing.txt

FROM busybox:latest
COPY --from=build /app/made.txt /app/listing.txt /out/
COPY --from=build --chown=1000:1000 /app /copied
USER 1000:1000
WORKDIR /out
LABEL team=rl
EXPOSE 8080
ENTRYPOINT ["cat"]
CMD ["made.txt"]
"""


def test_a_multi_stage_dockerfile_builds_an_image_that_runs(daemon, tmp_path):
    ctx = context(
        tmp_path,
        MULTI_STAGE,
        {
            "src/main.py": "print('hi')\n",
            "src/skip.log": "no",
            "src/keep.log": "yes",
            "tool.sh": "#!/bin/sh\necho tool\n",
            ".dockerignore": "src/*.log\n!src/keep.log\n",
        },
    )
    code, out, err = build(daemon, ctx, "-t", "multi:1", "--build-arg", "GREETING=hello")
    digest = out.strip()
    assert code == 0 and digest.startswith("sha256:"), err
    assert "built multi:1" in err
    rec = record(daemon, "multi:1")
    assert rec["digest"] == digest
    # busybox plus: the COPY --from and the COPY --from --chown (WORKDIR /out
    # is made by the first COPY); the build stage's layers are not in it.
    assert len(rec["layers"]) == 3, rec["layers"]
    config = rec["config"]
    assert config["entrypoint"] == ["cat"] and config["cmd"] == ["made.txt"]
    assert config["working_dir"] == "/out" and config["user"] == "1000:1000"
    # Its user, working directory and environment are the image's.
    assert run(daemon, "multi:1", "sh", "-c", "id -u; pwd; cat made.txt") == "1000\n/out\nhello from /app\n"
    assert run(daemon, "multi:1", "cat", "listing.txt").split() == ["keep.log", "listing.txt", "made.txt", "main.py"]
    # --chown took; the chmod'ed tool stayed in the build stage.
    sid = daemon.create(image="multi:1", user="0")["id"]
    try:
        _, stat, _, _ = daemon.exec(sid, ["sh", "-c", "stat -c '%u:%g %a' /copied/main.py /copied; ls /usr/local/bin/tool 2>&1; id -u"])
        lines = stat.decode().split("\n")
        assert lines[0] == "1000:1000 644" and lines[1].startswith("1000:1000"), lines
        assert "No such file" in lines[2] and lines[3] == "0", lines
    finally:
        daemon.destroy(sid)
    # The build stage, built alone, has the chmod'ed tool and the ENV.
    code, out, err = build(daemon, ctx, "-t", "multi:build", "--target", "build")
    assert code == 0, err
    assert run(daemon, "multi:build", "sh", "-c", "ls -l /usr/local/bin/tool | cut -c1-10; echo $LEVEL; tool") == (
        "-rwxr-x---\ntwo words\ntool\n"
    )
    # Every step's sandbox is gone.
    live = [s for s in daemon.http.get("/v1/sandboxes").json() if s["state"] in ("running", "creating")]
    assert live == [], live


def test_from_scratch_holds_only_what_is_copied(daemon, tmp_path):
    ctx = context(
        tmp_path,
        "FROM busybox:latest AS tools\nRUN echo hi > /greeting\n"
        "FROM scratch\nCOPY --from=tools /bin/busybox /bin/busybox\nCOPY --from=tools /greeting /greeting\n",
    )
    code, out, err = build(daemon, ctx, "-t", "scratchy:1")
    assert code == 0, err
    assert run(daemon, "scratchy:1", "/bin/busybox", "cat", "/greeting") == "hi\n"
    assert run(daemon, "scratchy:1", "/bin/busybox", "ls", "/bin") == "busybox\n"
    # No shell in it: a RUN fails as it would with Docker, naming its line.
    (ctx / "Dockerfile").write_text("FROM scratch\nRUN true\n")
    code, _, err = build(daemon, ctx, check=False)
    assert code != 0 and "Dockerfile line 2:" in err, err


def test_a_change_to_the_last_copy_rebuilds_only_what_follows(daemon, tmp_path):
    marker = uuid.uuid4().hex
    ctx = context(
        tmp_path,
        f"FROM busybox:latest\nRUN echo {marker} > /dep.txt\nCOPY requirements.txt /app/\nRUN cat /app/requirements.txt > /deps\nCOPY code/ /app/code/\nCMD [\"sh\"]\n",
        {"requirements.txt": "flask\n", "code/main.py": "v1\n"},
    )
    code, first, err = build(daemon, ctx, "-t", "cached:1")
    assert code == 0, err
    assert [c for _, c in steps(err)] == [True, False, False, False, False, False], err
    # Nothing changed: every step from the cache, the same digest.
    code, again, err = build(daemon, ctx, "-t", "cached:1")
    assert again == first and all(c for _, c in steps(err)), err
    # The code changes: only its COPY and what follows run again.
    (ctx / "code" / "main.py").write_text("v2\n")
    code, second, err = build(daemon, ctx, "-t", "cached:1")
    assert second != first
    assert steps(err) == [
        ("FROM busybox:latest", True),
        (f"RUN echo {marker} > /dep.txt", True),
        ("COPY requirements.txt /app/", True),
        ("RUN cat /app/requirements.txt > /deps", True),
        ("COPY code/ /app/code/", False),
        ('CMD ["sh"]', False),
    ], err
    assert run(daemon, "cached:1", "cat", "/app/code/main.py") == "v2\n"
    # A build arg a RUN sees is part of its key; --no-cache runs every step.
    code, _, err = build(daemon, ctx, "-t", "cached:1", "--no-cache")
    assert not any(c for _, c in steps(err)[1:]), err


def test_a_failing_test_leaves_the_tag_where_it_was(daemon, tmp_path):
    ctx = context(tmp_path, "FROM busybox:latest\nCOPY app.sh /app.sh\n", {"app.sh": "echo good\n"})
    code, good, err = build(daemon, ctx, "-t", "tested:1", "--test", "sh /app.sh | grep -q good")
    assert code == 0 and "test: sh /app.sh" in err, err
    (ctx / "app.sh").write_text("echo broken; echo oops >&2; exit 3\n")
    code, out, err = build(daemon, ctx, "-t", "tested:1", "--test", "sh /app.sh", check=False)
    assert code != 0 and out == ""
    assert "broken" in err and "oops" in err and "the test failed (exit code 3); tested:1 was not moved" in err, err
    assert record(daemon, "tested:1")["digest"] == good.strip()


@pytest.mark.parametrize(
    "dockerfile, line, words",
    [
        ("FROM busybox:latest\nRUN true\nRUN echo out; exit 7\n", 3, ["exited with code 7"]),
        ("FROM busybox:latest\n\nHEALTHCHECK CMD true\n", 3, ["HEALTHCHECK is not supported"]),
        ("FROM busybox:latest\nRUN --mount=type=cache,target=/c true\n", 2, ["RUN --mount is not supported"]),
        ("FROM busybox:latest\nCOPY missing.txt /x\n", 2, ["missing.txt is not in the build context"]),
        ("FROM busybox:latest\nCOPY ../../etc/passwd /x\n", 2, ["leaves the build context"]),
        ("FROM busybox:latest\nADD https://example.com/f /f\n", 2, ["URL"]),
        ("FROM nothing-here:1\n", 1, ["nothing-here"]),
        ("FROM busybox:latest\nEXPOSE http\n", 2, ["not PORT"]),
    ],
)
def test_what_cannot_be_built_names_its_line(daemon, tmp_path, dockerfile, line, words):
    before = {i["name"] for i in daemon.http.get("/v1/images").json()}
    ctx = context(tmp_path, dockerfile)
    code, out, err = build(daemon, ctx, "-t", "broken:1", check=False)
    assert code != 0 and out == "", err
    assert f"Dockerfile line {line}:" in err, err
    for w in words:
        assert w in err, err
    assert {i["name"] for i in daemon.http.get("/v1/images").json()} == before


def test_bad_requests_are_refused_before_anything_runs(daemon, tmp_path):
    ctx = context(tmp_path, "FROM busybox:latest\n")
    for args, words in [
        (["--build-arg", "1X=y"], "build_arg"),
        (["-t", "bad name"], "tag"),
        (["--allow", "no-port"], "allow"),
        (["--push", "app:1"], "names no registry"),
        (["-f", str(tmp_path / "elsewhere")], "Dockerfile"),
    ]:
        code, _, err = build(daemon, ctx, *args, check=False)
        assert code != 0 and words in err, (args, err)
    r = daemon.http.post("/v1/builds", params={"nocache": "1"}, content=b"")
    assert r.status_code == 400 and "unknown build parameter" in r.json()["error"]["message"]
    r = daemon.http.post("/v1/builds", content=b"not a tar archive at all")
    events = [json.loads(line) for line in r.text.splitlines()]
    assert events[0]["type"] == "build" and events[-1]["type"] == "failed", events
    info = daemon.http.get(f"/v1/builds/{events[0]['id']}").json()
    assert info["state"] == "failed" and info["events"] == events


def test_run_has_no_network_unless_the_build_allows_it(daemon, tmp_path, index):
    url = f"http://index.test:{index}/pkg"
    ctx = context(tmp_path, f"FROM busybox:latest\nRUN timeout 5 wget -q -O /pkg {url}\n")
    code, _, err = build(daemon, ctx, check=False)
    assert code != 0 and "exited with code" in err, err
    code, _, err = build(daemon, ctx, "-t", "fetched:1", "--allow", f"index.test:{index}")
    assert code == 0, err
    assert run(daemon, "fetched:1", "cat", "/pkg") == "package-bytes\n"


def test_the_sdk_builds_and_pushes_to_a_registry(daemon, tmp_path):
    import warren

    reg_mod = pytest.importorskip("test_registry")
    if not Path(reg_mod.REGISTRY_BIN).exists():
        pytest.skip("docker-registry is not installed")
    from test_registry import Registry, configure, insecure

    reg = Registry()
    try:
        configure(daemon, insecure(reg))
        ctx = context(tmp_path, "FROM busybox:latest\nARG V\nRUN echo $V > /v\n")
        seen = []
        with warren.Client(url=daemon.url, token=daemon.token) as client:
            result = client.images.build(
                ctx,
                tag="sdk-built:1",
                build_args={"V": "42"},
                push=f"{reg.host}/built/app:1",
                on_event=seen.append,
            )
            assert result.digest.startswith("sha256:") and result.tag == "sdk-built:1"
            assert [e.type for e in seen][0] == "build" and seen[-1].type == "done"
            assert any(e.type == "output" for e in seen) is False
            with pytest.raises(warren.BuildFailed) as failed:
                client.images.build(ctx, dockerfile="Dockerfile", target="nope")
            assert "no stage" in str(failed.value) and failed.value.build_id
        # The pushed image is the built one: pulled back by digest, it runs.
        pulled = daemon.http.post("/v1/images/pull", json={"reference": f"{reg.host}/built/app:1"}).json()
        assert pulled["digest"] == result.digest
        assert run(daemon, f"{reg.host}/built/app:1", "cat", "/v") == "42\n"
    finally:
        configure(daemon, "")
        reg.stop()
