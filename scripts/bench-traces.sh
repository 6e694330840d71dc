#!/usr/bin/env bash
# What exporting traces costs a create: two `warren up`s of the working
# tree measured by scripts/bench-ab.sh in alternating rounds, A without an
# endpoint, B exporting every span over OTLP/HTTP to a loopback sink that
# answers 200 and counts what it got (a collector that keeps up). Prints
# bench-ab.sh's Markdown and the sink's count, for docs/benchmarks.md.
#   Usage: scripts/bench-traces.sh [ITERATIONS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
rounds=${2:-3}
count=$(mktemp /tmp/warren-otlp-sink.XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 - "$port" "$count" <<'PY' &
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, out = int(sys.argv[1]), sys.argv[2]
got = {"requests": 0, "spans": 0}
lock = threading.Lock()
class Sink(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        spans = sum(len(ss.get("spans", [])) for rs in body.get("resourceSpans", [])
                    for ss in rs.get("scopeSpans", []))
        with lock:
            got["requests"] += 1
            got["spans"] += spans
            with open(out, "w") as f:
                json.dump(got, f)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
PY
sink=$!
trap 'kill "$sink" 2>/dev/null; rm -f "$count"' EXIT
A_ARGS="" B_ARGS="--otlp-endpoint http://127.0.0.1:$port" scripts/bench-ab.sh . "$n" "$rounds"
echo
echo "The sink got: $(cat "$count")"
