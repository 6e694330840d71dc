#!/usr/bin/env bash
# What the cluster's extra hop costs on real sandboxes: `warren-bench lifecycle`
# (create, exec round trip, destroy) against a `warren up`, and against a
# `warren server` driving one `warren node` on this machine, alternately,
# ROUNDS times each, same run.   scripts/bench-server-hop.sh [ITERATIONS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
iterations=${1:-200}
rounds=${2:-2}
bin=${WARREN_BIN:-target/release/warren}
bench_bin=${WARREN_BENCH_BIN:-$(dirname "$bin")/warren-bench}
[ -x "$bin" ] && [ -x "$bench_bin" ] || cargo build --release -q -p warren -p warren-bench
work=$(mktemp -d /tmp/warren-bench-hop.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
scripts/make-busybox-image.sh "$work/busybox.tar" >/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
healthy() { for _ in $(seq 200); do curl -fsS "$1/healthz" 2>/dev/null | grep -q '^ok' && return 0; sleep 0.1; done; return 1; }
# Hundreds of one-core sandboxes alive at once on a few cores: admit them
# all (each is still capped by its own quota), as scripts/lib/bench-daemon.sh.
sizes=(--cpu-overcommit 256)

bench() { # LABEL URL HOME
    WARREN_URL=$2 WARREN_HOME=$3 "$bin" image import "$work/busybox.tar" --name busybox:latest >/dev/null
    echo "== $1"
    WARREN_URL=$2 WARREN_HOME=$3 "$bench_bin" lifecycle --image busybox:latest --iterations "$iterations" --concurrency 1,8 --idle 0
}

for r in $(seq 1 "$rounds"); do
    port=$(free_port); home=$work/up-$r
    "$bin" up --home "$home" --listen 127.0.0.1:"$port" "${sizes[@]}" 2>"$work/up-$r.log" &
    pids=("$!")
    healthy "http://127.0.0.1:$port"
    bench "warren up (round $r)" "http://127.0.0.1:$port" "$home"
    kill -INT "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true

    port=$(free_port); home=$work/server-$r
    "$bin" server --home "$home" --listen 127.0.0.1:"$port" 2>"$work/server-$r.log" &
    pids=("$!")
    healthy "http://127.0.0.1:$port"
    "$bin" node --home "$work/node-$r" --server "http://127.0.0.1:$port" --join-token "$home/join-token" \
        --listen 127.0.0.1:0 --name hop "${sizes[@]}" 2>"$work/node-$r.log" &
    pids+=("$!")
    for _ in $(seq 200); do
        curl -fsS -H "Authorization: Bearer $(cat "$home/token")" "http://127.0.0.1:$port/v1/nodes" | grep -q '"state":"ready"' && break
        sleep 0.1
    done
    bench "warren server + warren node (round $r)" "http://127.0.0.1:$port" "$home"
    WARREN_URL=http://127.0.0.1:$port WARREN_HOME=$home "$bin" ps --json | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' \
        | WARREN_URL=http://127.0.0.1:$port WARREN_HOME=$home xargs -r "$bin" rm >/dev/null 2>&1 || true
    kill -INT "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
    # The node agent leaves sandboxes running by design; a `warren up` on its
    # home takes whatever is left over and removes it when it stops.
    port=$(free_port)
    "$bin" up --home "$work/node-$r" --listen 127.0.0.1:"$port" 2>/dev/null & p=$!
    healthy "http://127.0.0.1:$port" || true
    kill -INT $p; wait $p 2>/dev/null || true
    pids=()
done
