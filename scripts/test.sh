#!/usr/bin/env bash
# The whole test suite: Rust unit tests, then the integration tests that run
# `warren up` as root against the real kernel. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run the tests as root: they create namespaces, cgroups and mounts" >&2; exit 1; }
scripts/install-deps.sh --test
# The deployment files (deploy/): Kubernetes manifests and systemd units, in
# seconds, before the long steps.
scripts/validate-deploy.sh
# The suite's downloads (Debian userlands, client SDKs), beside the build:
# they wait on the network and the disk, the build on the CPUs. A failure
# here is reported by the tests that need what is missing.
logs=$(mktemp -d /tmp/warren-test-logs-XXXXXX)
pg_dir=
prefetch=
passes=
# Background steps run in sessions of their own: on an early exit the whole
# group is signalled. The test passes get SIGINT, as from a terminal, so
# pytest tears its daemons down (bash starts background jobs with SIGINT
# ignored; `env --default-signal` gives it back).
cleanup() {
    [ -z "$prefetch" ] || kill -TERM -- "-$prefetch" 2>/dev/null || true
    for p in $passes; do kill -INT -- "-$p" 2>/dev/null || true; done
    for p in $passes; do wait "$p" 2>/dev/null || true; done
    [ -z "$pg_dir" ] || scripts/pg-temp.sh stop "$pg_dir"
    rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
setsid python3 tests/caches.py >"$logs/caches.log" 2>&1 &
prefetch=$!
# Sandbox inits running before the tests (another Warren on this machine)
# are not the tests' to answer for; any other one at the end is a leak.
inits_before=$(pgrep -f '^/.warren-init' || true)
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --all-targets
# The escape suite's probe runs inside sandboxes: a static binary.
cargo rustc -q -p warren-probe --release -- -C target-feature=+crt-static
# A throw-away PostgreSQL (scripts/pg-temp.sh): with its URL in
# WARREN_TEST_DATABASE_URL the store tests run against PostgreSQL as well
# as SQLite (they fail, never skip, if it cannot be reached). Removed on
# any exit; fsync off, as nothing here tests PostgreSQL's durability.
pg_dir=$(mktemp -d /tmp/warren-pg-XXXXXX)
WARREN_TEST_DATABASE_URL=$(PG_TEMP_OPTS="-c fsync=off" scripts/pg-temp.sh start "$pg_dir")
export WARREN_TEST_DATABASE_URL
cargo test --workspace
# The fuzz targets (fuzz/): every committed seed, corpus input and past
# crash, once (open-ended fuzzing is `scripts/fuzz.sh explore`, outside CI).
scripts/fuzz.sh replay
wait "$prefetch" || { echo "making the suite's downloads failed:" >&2; tail -n 20 "$logs/caches.log" >&2; }
prefetch=
# The Python suite twice at once: as is, and with every daemon's control
# plane driving its node through the node API over loopback HTTP, as a
# cluster's control plane does. Every test makes its own daemon, home,
# ports and sandboxes, and a suite spends most of its time waiting, so the
# two share the machine (a pass alone leaves two thirds of it idle). The
# few tests marked `alone` (they step the wall clock or measure host-wide
# memory or counters) run afterwards, one at a time.
http=(env WARREN_TEST_UP_ARGS="--node-transport http")
pytest=(python3 -m pytest -q -p no:cacheprovider tests "$@")
setsid env --default-signal=INT "${pytest[@]}" -m "not alone" >"$logs/in-process.log" 2>&1 &
in_process=$!
setsid env --default-signal=INT "${http[@]}" "${pytest[@]}" -m "not alone" >"$logs/http-node.log" 2>&1 &
http_node=$!
passes="$in_process $http_node"
failed=0
for pass in in-process:$in_process http-node:$http_node; do
    # 5: the arguments selected none of its tests.
    wait "${pass#*:}" || [ $? = 5 ] || failed=1
    echo "== the Python suite, ${pass%%:*}:"
    cat "$logs/${pass%%:*}.log"
done
passes=
[ "$failed" = 0 ] || exit 1
echo "== the tests that run alone, in-process and http-node:"
"${pytest[@]}" -m alone || [ $? = 5 ]
"${http[@]}" "${pytest[@]}" -m alone || [ $? = 5 ]
# Nothing the tests made may outlive them: every daemon they started has
# stopped, so a sandbox init still running was leaked.
leaked=$(comm -13 <(sort <<<"$inits_before") <(pgrep -f '^/.warren-init' | sort) | grep . || true)
if [ -n "$leaked" ]; then
    for p in $leaked; do
        echo "leaked sandbox init: pid $p, $(grep -m1 pids: "/proc/$p/cgroup" 2>/dev/null || echo gone)" >&2
    done
    exit 1
fi
