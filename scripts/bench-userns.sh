#!/usr/bin/env bash
# What user namespaces cost at create: two `warren up`s side by side, one
# with user namespaces (the default) and one with --no-userns, measured in
# alternating rounds so both see the same machine load. Prints Markdown for
# docs/benchmarks.md.   Usage: scripts/bench-userns.sh [ITERATIONS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100}
rounds=${2:-3}
scripts/install-deps.sh --test
cargo build --release -p warren -p warren-bench
bin=$PWD/target/release/warren
bench=$PWD/target/release/warren-bench
work=$(mktemp -d /tmp/warren-bench-userns.XXXXXX)
pids=()
cleanup() {
    for mode in userns nouserns; do
        WARREN_URL=$(cat "$work/$mode.url" 2>/dev/null || true) WARREN_HOME=$work/$mode \
            "$bin" ps --json 2>/dev/null | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' \
            | WARREN_URL=$(cat "$work/$mode.url" 2>/dev/null || true) WARREN_HOME=$work/$mode xargs -r "$bin" rm >/dev/null 2>&1 || true
    done
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
scripts/make-busybox-image.sh "$work/busybox.tar" >/dev/null
port=7083
for mode in userns nouserns; do
    flags=()
    [ "$mode" = nouserns ] && flags=(--no-userns)
    mkdir -p "$work/$mode"
    "$bin" up --home "$work/$mode" --listen 127.0.0.1:$port --cpu-overcommit 256 "${flags[@]}" 2>"$work/$mode.log" &
    pids+=($!)
    echo "http://127.0.0.1:$port" > "$work/$mode.url"
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
    WARREN_URL=http://127.0.0.1:$port WARREN_HOME=$work/$mode "$bin" image import "$work/busybox.tar" --name busybox:latest >/dev/null
    port=$((port + 1))
done
for r in $(seq "$rounds"); do
    for mode in userns nouserns; do
        WARREN_URL=$(cat "$work/$mode.url") WARREN_HOME=$work/$mode \
            "$bench" lifecycle --image busybox:latest --iterations "$n" --concurrency 1,8 --idle 0 --json > "$work/$mode.$r.json"
    done
done
python3 - "$work" "$rounds" "$n" <<'PY'
import json, statistics, sys
from pathlib import Path
work, rounds, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def rows(mode):
    runs = [json.loads((work / f"{mode}.{r}.json").read_text()) for r in range(1, rounds + 1)]
    return runs
print(f"| measurement | user namespaces p50 ms | --no-userns p50 ms | difference ms |")
print("|---|---:|---:|---:|")
def p50s(runs, key):
    vals = []
    for run in runs:
        for m in run:
            if m["name"] == key:
                vals.append(m["p50_ms"])
    return vals
a, b = rows("userns"), rows("nouserns")
keys = [m["name"] for m in a[0]]
for key in keys:
    va, vb = p50s(a, key), p50s(b, key)
    if not va or not vb or None in va + vb:
        continue
    ma, mb = statistics.median(va), statistics.median(vb)
    print(f"| {key} | {ma:.2f} | {mb:.2f} | {ma - mb:+.2f} |")
print()
print(f"Median of {rounds} alternating rounds of {n} iterations each.")
PY
