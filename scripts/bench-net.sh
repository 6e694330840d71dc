#!/usr/bin/env bash
# The network benchmark: what network mode `allowlist` costs (create latency
# against `none`, proxy latency and CONNECT throughput against direct, many
# live policies). Prints JSON for docs/benchmarks.md.
#   Usage: scripts/bench-net.sh [ITERATIONS] [SANDBOXES]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100}
k=${2:-500}
. scripts/lib/bench-daemon.sh
start_bench_daemon 7078
echo "# $(date -u +%Y-%m-%d) on $(nproc) cores, $(uname -r)"
"$bench" net --image busybox:latest --iterations "$n" --sandboxes "$k" --daemon-pid "$pid" --json
