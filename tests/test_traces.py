"""Traces over OTLP/HTTP (docs/observability.md): a create's trace shows its
control-plane phases and, under its node call, the node's own phases at the
times they ran; exec and file calls have spans of their own; each says which
sandbox (id, tenant, node, labels) it is about."""

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cluster import Cluster
from conftest import WARREN, own_daemon
from helpers import wait_until
from test_create_phases import NODE_PHASES, SPAWNER_PHASES

# Spans are sent in batches every 200 ms instead of every 5 s.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200"}


class Receiver:
    """An OTLP/HTTP collector on loopback: every span it was sent, with the
    service that sent it."""

    def __init__(self):
        self.spans = []
        self.requests = []
        got = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.requests.append((self.path, self.headers.get("Content-Type"), body))
                if self.headers.get("Content-Type") == "application/json":
                    got.take(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def take(self, msg):
        for rs in msg.get("resourceSpans", []):
            service = attrs(rs.get("resource", {})).get("service.name")
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    s["service"] = service
                    s["attrs"] = attrs(s)
                    s["start"] = int(s["startTimeUnixNano"])
                    s["end"] = int(s["endTimeUnixNano"])
                    self.spans.append(s)

    def named(self, name, trace=None, **want):
        return [s for s in self.spans
                if s["name"] == name and trace in (None, s["traceId"])
                and all(s["attrs"].get(k) == v for k, v in want.items())]

    def one(self, name, trace=None, **want):
        """The one span called `name` (in `trace`, if given) whose
        attributes include `want`, once it has come."""
        return wait_until(lambda: (lambda m: m[0] if len(m) == 1 else None)(self.named(name, trace, **want)),
                          timeout=30, what=f"one span {name} {want}")

    def close(self):
        self.srv.shutdown()


def attrs(obj):
    out = {}
    for a in obj.get("attributes", []):
        (kind, v), = a["value"].items()
        out[a["key"]] = int(v) if kind == "intValue" else v
    return out


def test_a_create_exec_and_files_are_traced_with_the_node_phases_inside_the_node_call(images):
    otlp = Receiver()
    try:
        with own_daemon(images, args=["--otlp-endpoint", otlp.url], env=FAST_EXPORT) as w:
            s = w.create(labels={"task": "traced", "code": "v3"})
            sid = s["id"]
            exit_ev, _, _, _ = w.exec(sid, ["sh", "-c", "exit 3"])
            assert exit_ev["code"] == 3, exit_ev
            r = w.http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/t.txt"}, content=b"hi")
            assert r.status_code in (200, 204), r.text
            r = w.http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/tmp/t.txt"})
            assert r.content == b"hi", r.text
            ctx = w.home.parent / "ctx"
            ctx.mkdir()
            (ctx / "Dockerfile").write_text("FROM busybox:latest\nRUN echo traced > /made\n")
            w.cli("build", "-t", "traced:1", str(ctx), timeout=120)
            gone = w.create()["id"]
            w.destroy(gone)
            assert w.http.post(f"/v1/sandboxes/{gone}/exec", json={"cmd": ["true"]}).status_code == 409

            root = otlp.one("sandbox create", **{"warren.sandbox.id": sid})
            # (With --node-transport http the node's own `node create` is
            # in the trace too; the control plane's names the node.)
            call = otlp.one("node create", root["traceId"], **{"warren.node": s["node"]})
            wait_until(lambda: all(otlp.named(p, root["traceId"]) for p in NODE_PHASES + SPAWNER_PHASES),
                       timeout=30, what="the node's phases")
            exec_span = otlp.one("sandbox exec", **{"warren.sandbox.id": sid})
            write = otlp.one("sandbox file write", **{"warren.sandbox.id": sid})
            read = otlp.one("sandbox file read", **{"warren.sandbox.id": sid})
            build = otlp.one("image build", **{"warren.build.tag": "traced:1"})
            run_step = otlp.one("build step", build["traceId"], **{"warren.build.line": 2})
            step_exec = otlp.one("sandbox exec", build["traceId"])
            refused = wait_until(
                lambda: [x for x in otlp.named("sandbox exec") if x.get("status", {}).get("message")],
                timeout=30, what="the refused exec's span")
    finally:
        otlp.close()

    assert {r[0] for r in otlp.requests} == {"/v1/traces"}, otlp.requests
    # One trace: the API call at its root, its phases below it.
    trace = root["traceId"]
    assert not root.get("parentSpanId"), root
    assert root["service"] == "warren-up", root
    assert root["attrs"]["warren.label.task"] == "traced", root
    assert root["attrs"]["warren.label.code"] == "v3", root
    assert root["attrs"]["warren.tenant"] and root["attrs"]["warren.node"] == s["node"], root
    in_trace = [x for x in otlp.spans if x["traceId"] == trace]
    by_id = {x["spanId"]: x for x in in_trace}
    for name in ("image resolve", "admission", "store insert", "node create", "answer"):
        (child,) = [x for x in in_trace if x["name"] == name and x["parentSpanId"] == root["spanId"]]
        assert root["start"] <= child["start"] <= child["end"] <= root["end"], (name, child, root)
    assert call["traceId"] == trace and call["attrs"]["warren.node"] == s["node"]
    # The node's phases, where they ran: inside the node call, one after
    # another; the spawner's inside runtime_spawn.
    phases = {p: [x for x in in_trace if x["name"] == p] for p in NODE_PHASES + SPAWNER_PHASES}
    assert all(len(v) == 1 for v in phases.values()), phases
    phases = {p: v[0] for p, v in phases.items()}
    previous_end = call["start"]
    for p in NODE_PHASES:
        span = phases[p]
        assert span["parentSpanId"] == call["spanId"], (p, span)
        assert call["start"] <= span["start"] <= span["end"] <= call["end"], (p, span, call)
        assert span["start"] >= previous_end, (p, span, previous_end)
        previous_end = span["end"]
    spawn = phases["runtime_spawn"]
    for p in SPAWNER_PHASES:
        span = phases[p]
        assert span["parentSpanId"] == spawn["spanId"], (p, span)
        assert spawn["start"] <= span["start"] <= span["end"] <= spawn["end"], (p, span, spawn)
    assert set(by_id) >= {phases[p]["spanId"] for p in phases}

    # Exec: its own trace, the sandbox named, its exit code.
    assert exec_span["attrs"]["warren.exec.exit_code"] == 3, exec_span
    assert exec_span["attrs"]["warren.label.task"] == "traced", exec_span
    assert exec_span.get("status", {}).get("code") in (None, 0, "STATUS_CODE_UNSET"), exec_span
    for f in (write, read):
        assert f["attrs"]["warren.file.path"] == "/tmp/t.txt", f
        assert f["attrs"]["warren.node"] == s["node"], f
    # A build: a span per step under its root; a RUN step's sandbox is
    # created and runs its command under the step.
    in_build = {x["spanId"]: x for x in otlp.spans if x["traceId"] == build["traceId"]}
    steps = [x for x in in_build.values() if x["name"] == "build step"]
    assert sorted(x["attrs"]["warren.build.instruction"] for x in steps) == [
        "FROM busybox:latest", "RUN echo traced > /made"], steps
    assert all(x["parentSpanId"] == build["spanId"] for x in steps), steps
    assert run_step["attrs"]["warren.build.cached"] is False, run_step
    (step_create,) = [x for x in in_build.values() if x["name"] == "sandbox create"]
    assert step_create["parentSpanId"] == run_step["spanId"], step_create
    assert step_exec["parentSpanId"] == run_step["spanId"], step_exec
    assert step_exec["attrs"]["warren.exec.exit_code"] == 0, step_exec

    # An exec that could not run is an error span.
    (refused,) = refused
    assert refused["status"]["code"] in (2, "STATUS_CODE_ERROR"), refused
    assert gone in refused["status"]["message"], refused
    assert refused["attrs"]["warren.sandbox.id"] == gone, refused


def test_a_remote_node_traces_its_side_of_a_create_in_the_same_trace(images, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", FAST_EXPORT["OTEL_BSP_SCHEDULE_DELAY"])
    otlp = Receiver()
    try:
        with Cluster(images, server_args=["--otlp-endpoint", otlp.url],
                     nodes=[dict(name="traced", extra=["--otlp-endpoint", otlp.url])]) as c:
            sid = c.server.create(labels={"task": "remote"})["id"]
            root = otlp.one("sandbox create", **{"warren.sandbox.id": sid})
            call = otlp.one("node create", root["traceId"], **{"warren.node": "traced"})
            served = wait_until(
                lambda: [x for x in otlp.named("node create")
                         if x["service"] == "warren-node" and x["traceId"] == root["traceId"]],
                timeout=30, what="the node's span of the create")
            wait_until(lambda: otlp.named("node_register", root["traceId"]), timeout=30,
                       what="the node's phases")
    finally:
        otlp.close()
    assert root["service"] == call["service"] == "warren-server", (root, call)
    (served,) = served
    # The node's span of the call is under the server's, in its trace (W3C
    # traceparent over the node API).
    assert served["parentSpanId"] == call["spanId"], (served, call)
    assert served["attrs"]["warren.call"] == "create", served
    (register,) = otlp.named("node_register", root["traceId"])
    assert register["parentSpanId"] == call["spanId"], register
    assert call["start"] <= register["start"] <= register["end"] <= call["end"]
    # The server's own polls of the node start no traces there.
    assert {x["traceId"] for x in otlp.spans if x["service"] == "warren-node"} == {root["traceId"]}


def test_protobuf_is_sent_when_asked_for(images):
    otlp = Receiver()
    try:
        with own_daemon(images, args=["--otlp-endpoint", otlp.url],
                        env={**FAST_EXPORT, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) as w:
            sid = w.create(labels={"task": "proto"})["id"]
            # The protobuf message holds the sandbox id as a string value.
            wait_until(lambda: any(sid.encode() in body for _, _, body in otlp.requests),
                       timeout=30, what="a protobuf export naming the sandbox")
    finally:
        otlp.close()
    assert {(path, kind) for path, kind, _ in otlp.requests} == {("/v1/traces", "application/x-protobuf")}
    assert not otlp.spans


def test_what_cannot_be_exported_to_is_refused_at_start(warren):
    p = warren.cli("up", "--home", "/nonexistent/x", "--otlp-endpoint", "collector:4318", check=False)
    assert p.returncode != 0 and b"an http:// or https:// URL" in p.stderr, p.stderr
    p = subprocess.run([str(WARREN), "up", "--home", "/nonexistent/x", "--otlp-endpoint", "http://127.0.0.1:4318"],
                       env={**warren.env(), "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, capture_output=True, timeout=60)
    assert p.returncode != 0 and b"OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in p.stderr, p.stderr
