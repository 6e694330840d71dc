#!/usr/bin/env bash
# What a change costs: the release build of an earlier revision (A) and of
# the working tree (B) side by side, two `warren up`s measured by
# `warren-bench lifecycle` in alternating rounds so both see the same machine
# load. Prints Markdown for docs/benchmarks.md. Both sides are measured by
# the working tree's warren-bench: the client is the same, only the daemons
# differ (and a REV from before warren-bench has none).
#   Usage: scripts/bench-ab.sh REV [ITERATIONS] [ROUNDS]
# REV `.` compares the working tree with itself, under different `warren
# up` flags (A_ARGS, B_ARGS), e.g. the node driven in-process or over HTTP:
#   A_ARGS="--node-transport in-process" B_ARGS="--node-transport http" scripts/bench-ab.sh . 200 3
# A_BIN=PATH takes A's binary from PATH (a release build of REV made
# before) instead of building REV.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?give the revision to compare against, e.g. HEAD~3}
n=${2:-200}
rounds=${3:-3}
scripts/install-deps.sh --test
work=$(mktemp -d /tmp/warren-bench-ab.XXXXXX)
pids=()
cleanup() {
    for side in a b; do
        [ -x "$work/$side/warren" ] || continue
        WARREN_URL=$(cat "$work/$side.url" 2>/dev/null || true) WARREN_HOME=$work/$side/home \
            "$work/$side/warren" ps --json 2>/dev/null | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' \
            | WARREN_URL=$(cat "$work/$side.url" 2>/dev/null || true) WARREN_HOME=$work/$side/home xargs -r "$work/$side/warren" rm >/dev/null 2>&1 || true
    done
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
    git worktree remove --force "$work/tree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/a" "$work/b"
# A: the earlier revision, built in a worktree with a target directory of
# its own (kept between runs, so a second comparison builds incrementally).
cargo build --release -p warren -p warren-bench
cp target/release/warren "$work/b/warren"
cp target/release/warren-bench "$work/warren-bench"
if [ -n "${A_BIN:-}" ]; then
    cp "$A_BIN" "$work/a/warren"
elif [ "$rev" = . ]; then
    cp target/release/warren "$work/a/warren"
else
    git worktree add --detach "$work/tree" "$rev" >/dev/null
    (cd "$work/tree" && CARGO_TARGET_DIR=/var/tmp/warren-bench-ab-target cargo build --release -p warren)
    cp /var/tmp/warren-bench-ab-target/release/warren "$work/a/warren"
fi
scripts/make-busybox-image.sh "$work/busybox.tar" >/dev/null
port=7093
for side in a b; do
    mkdir -p "$work/$side/home"
    if [ $side = a ]; then extra=${A_ARGS:-}; else extra=${B_ARGS:-}; fi
    # shellcheck disable=SC2086 # the flags are words on purpose
    "$work/$side/warren" up --home "$work/$side/home" --listen 127.0.0.1:$port --cpu-overcommit 256 $extra 2>"$work/$side.log" &
    pids+=($!)
    echo "http://127.0.0.1:$port" > "$work/$side.url"
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" | grep -q ok && break; sleep 0.1; done
    WARREN_URL=http://127.0.0.1:$port WARREN_HOME=$work/$side/home "$work/$side/warren" image import "$work/busybox.tar" --name busybox:latest >/dev/null
    port=$((port + 1))
done
for r in $(seq "$rounds"); do
    # Who goes first alternates: a run slows the one after it (the kernel
    # is still reclaiming the first one's 200 sandboxes), by ~2 ms a create.
    if [ $((r % 2)) = 1 ]; then order="a b"; else order="b a"; fi
    for side in $order; do
        WARREN_URL=$(cat "$work/$side.url") WARREN_HOME=$work/$side/home \
            "$work/warren-bench" lifecycle --image busybox:latest --iterations "$n" --concurrency 1,8 --idle 0 --json > "$work/$side.$r.json"
    done
done
python3 - "$work" "$rounds" "$n" "$rev" "${A_ARGS:-}" "${B_ARGS:-}" <<'PY'
import json, statistics, sys
from pathlib import Path
work, rounds, n, rev = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
a_name = f"{rev} {sys.argv[5]}".strip() if rev != "." else (sys.argv[5] or "A")
b_name = f"working tree {sys.argv[6]}".strip() if rev != "." else (sys.argv[6] or "B")
def p50s(side, key):
    vals = []
    for r in range(1, rounds + 1):
        for m in json.loads((work / f"{side}.{r}.json").read_text()):
            if m["name"] == key and m.get("p50_ms") is not None:
                vals.append(m["p50_ms"])
    return vals
keys = [m["name"] for m in json.loads((work / "a.1.json").read_text())]
print(f"| measurement | {a_name} p50 ms | {b_name} p50 ms | difference ms |")
print("|---|---:|---:|---:|")
for key in keys:
    va, vb = p50s("a", key), p50s("b", key)
    if va and vb:
        ma, mb = statistics.median(va), statistics.median(vb)
        print(f"| {key} | {ma:.2f} | {mb:.2f} | {mb - ma:+.2f} |")
print()
print(f"Median of {rounds} rounds of {n} iterations each, the two sides taking turns to go first.")
PY
