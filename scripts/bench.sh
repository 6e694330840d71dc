#!/usr/bin/env bash
# The benchmark: Warren through its HTTP API beside runc, bubblewrap and
# podman, in the same run, on the same busybox-static image. Prints Markdown
# for docs/benchmarks.md.   Usage: scripts/bench.sh [ITERATIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
. scripts/lib/bench-daemon.sh
start_bench_daemon 7079
"$bench" lifecycle --image busybox:latest --iterations "$n" --idle 200 --daemon-pid "$pid" --json > "$work/warren.json"
echo "## $(date -u +%Y-%m-%d) on $(nproc) cores, $(uname -r), $(stat -fc %T /sys/fs/cgroup | sed 's/tmpfs/cgroup v1/;s/cgroup2fs/cgroup v2/')"
echo
python3 scripts/bench_compare.py --warren-json "$work/warren.json" --image-tar "$work/busybox.tar" --iterations "$n" --warren-bin "$bin" --bench-bin "$bench"
