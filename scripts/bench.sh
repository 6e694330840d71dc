#!/usr/bin/env bash
# The benchmark: Warren through its HTTP API beside runc, bubblewrap and
# podman, in the same run, on the same busybox-static image. Prints Markdown
# for docs/benchmarks.md.   Usage: scripts/bench.sh [ITERATIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
scripts/install-deps.sh
cargo build --release -p warren
bin=$PWD/target/release/warren
work=$(mktemp -d /tmp/warren-bench.XXXXXX)
home=$work/home
port=7079
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
"$bin" bench --image busybox:latest --iterations "$n" --idle 200 --daemon-pid "$pid" --json > "$work/warren.json"
echo "## $(date -u +%Y-%m-%d) on $(nproc) cores, $(uname -r), $(stat -fc %T /sys/fs/cgroup | sed 's/tmpfs/cgroup v1/;s/cgroup2fs/cgroup v2/')"
echo
python3 scripts/bench_compare.py --warren-json "$work/warren.json" --image-tar "$work/busybox.tar" --iterations "$n"
