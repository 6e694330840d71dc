"""A stand-in for E2B's code-interpreter server (template/server in
e2b-dev/code-interpreter: FastAPI over Jupyter), speaking its protocol on
port 49999 with only the standard library: `POST /execute` streams NDJSON
(`stdout`, `stderr`, `result`, `error`, `number_of_executions`), and
`/contexts` makes, lists, restarts and deletes execution contexts. Baked
into a test image, it lets the real `e2b_code_interpreter` SDK run against
Warren where the real template image cannot be built (no network)."""

import ast
import contextlib
import datetime
import io
import json
import threading
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTEXTS = {}
LOCK = threading.Lock()


def new_context(language="python", cwd="/root"):
    ctx = {"id": uuid.uuid4().hex, "language": language, "cwd": cwd, "globals": {}, "count": 0}
    CONTEXTS[ctx["id"]] = ctx
    return ctx


DEFAULT = new_context()


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def run(ctx, code):
    """Runs code as a notebook cell: the last expression is the result."""
    out, err = io.StringIO(), io.StringIO()
    lines, result = [], None
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(tree, "<cell>", "exec"), ctx["globals"])
            if last is not None:
                result = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ctx["globals"])
        error = None
    except Exception as e:  # a cell's error is its answer
        error = {"type": "error", "name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()}
    for kind, buf in (("stdout", out), ("stderr", err)):
        if buf.getvalue():
            lines.append({"type": kind, "text": buf.getvalue(), "timestamp": now()})
    if error:
        lines.append(error)
    elif result is not None:
        lines.append({"type": "result", "text": repr(result), "is_main_result": True})
    ctx["count"] += 1
    lines.append({"type": "number_of_executions", "execution_count": ctx["count"]})
    return lines


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def public(self, ctx):
        return {k: ctx[k] for k in ("id", "language", "cwd")}

    def do_GET(self):
        if self.path == "/health":
            return self.answer(200, b"OK", "text/plain")
        if self.path == "/contexts":
            return self.answer(200, [self.public(c) for c in CONTEXTS.values()])
        self.answer(404, {"detail": "not found"})

    def do_POST(self):
        req = self.body()
        if self.path == "/execute":
            ctx = CONTEXTS.get(req.get("context_id") or DEFAULT["id"])
            if ctx is None:
                return self.answer(404, {"detail": "context not found"})
            with LOCK:
                lines = run(ctx, req["code"])
            return self.answer(200, "".join(json.dumps(l) + "\n" for l in lines).encode(), "application/x-ndjson")
        if self.path == "/contexts":
            return self.answer(200, self.public(new_context(req.get("language") or "python", req.get("cwd") or "/root")))
        if self.path.startswith("/contexts/") and self.path.endswith("/restart"):
            ctx = CONTEXTS.get(self.path.split("/")[2])
            if ctx is None:
                return self.answer(404, {"detail": "context not found"})
            ctx["globals"], ctx["count"] = {}, 0
            return self.answer(200, {})
        self.answer(404, {"detail": "not found"})

    def do_DELETE(self):
        if self.path.startswith("/contexts/") and CONTEXTS.pop(self.path.split("/")[2], None):
            return self.answer(200, {})
        self.answer(404, {"detail": "context not found"})


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 49999), Handler).serve_forever()
