#!/usr/bin/env bash
# The network benchmark: what network mode `allowlist` costs (create latency
# against `none`, proxy latency and CONNECT throughput against direct, many
# live policies). Prints JSON for docs/benchmarks.md.
#   Usage: scripts/bench-net.sh [ITERATIONS] [SANDBOXES]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100}
k=${2:-500}
scripts/install-deps.sh
cargo build --release -p warren
bin=$PWD/target/release/warren
work=$(mktemp -d /tmp/warren-bench-net.XXXXXX)
home=$work/home
port=7078
cleanup() {
    [ -n "${pid:-}" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
scripts/make-busybox-image.sh "$work/busybox.tar" >/dev/null
"$bin" up --home "$home" --listen 127.0.0.1:$port 2>"$work/up.log" &
pid=$!
export WARREN_URL=http://127.0.0.1:$port WARREN_HOME=$home
for _ in $(seq 100); do curl -sf "$WARREN_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
"$bin" image import "$work/busybox.tar" --name busybox:latest >/dev/null
echo "# $(date -u +%Y-%m-%d) on $(nproc) cores, $(uname -r)"
"$bin" bench-net --image busybox:latest --iterations "$n" --sandboxes "$k" --daemon-pid "$pid" --json
