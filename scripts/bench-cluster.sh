#!/usr/bin/env bash
# The control plane alone, end to end: `warren server` on PostgreSQL (and on
# SQLite, same run) with COUNT fake nodes (in-memory nodes that speak the
# real node API but make no sandboxes), then `warren-bench creates` through
# the public API. Results go to docs/benchmarks.md by hand.
#   scripts/bench-cluster.sh [SANDBOXES] [NODES] [CONCURRENCY]
set -euo pipefail
cd "$(dirname "$0")/.."
sandboxes=${1:-20000}
nodes=${2:-200}
concurrency=${3:-64}
bin=${WARREN_BIN:-target/release/warren}
bench=${WARREN_BENCH_BIN:-$(dirname "$bin")/warren-bench}
[ -x "$bin" ] && [ -x "$bench" ] || cargo build --release -q -p warren -p warren-bench
work=$(mktemp -d /tmp/warren-bench-cluster-XXXXXX)
pgdir=/tmp/warren-bench-pg-$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    scripts/pg-temp.sh stop "$pgdir" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

wait_nodes() { # URL TOKEN COUNT
    for _ in $(seq 1 600); do
        n=$(curl -fsS -H "Authorization: Bearer $2" "$1/v1/nodes" | python3 -c 'import json,sys; print(sum(1 for n in json.load(sys.stdin) if n["state"]=="ready"))' 2>/dev/null || echo 0)
        [ "$n" -ge "$3" ] && return 0
        sleep 0.2
    done
    echo "only $n of $3 nodes became ready" >&2
    return 1
}

run() { # NAME DATABASE
    local name=$1 database=$2 home=$work/$1 port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mkdir -p "$home"
    local args=(server --home "$home" --listen "127.0.0.1:$port" --queue-limit 1000000)
    [ -n "$database" ] && args+=(--database "$database")
    "$bin" "${args[@]}" 2>"$home/server.err" &
    local server=$!
    pids+=("$server")
    for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/healthz" 2>/dev/null | grep -q ok && break; sleep 0.1; done
    "$bench" fake-nodes --server "http://127.0.0.1:$port" --join-token "$home/join-token" --count "$nodes" 2>"$home/nodes.err" &
    pids+=("$!")
    local token
    token=$(cat "$home/token")
    wait_nodes "http://127.0.0.1:$port" "$token" "$nodes"
    echo "== $name: $sandboxes sandboxes over $nodes fake nodes, concurrency $concurrency"
    WARREN_URL="http://127.0.0.1:$port" WARREN_TOKEN=$token \
        "$bench" creates --image busybox:latest --count "$sandboxes" --concurrency "$concurrency"
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    pids=()
}

url=$(scripts/pg-temp.sh start "$pgdir" | tail -1)
echo "$(date -u +%FT%TZ) $(nproc) cores, $("$bin" --version)"
run postgres "$url"
run sqlite ""
