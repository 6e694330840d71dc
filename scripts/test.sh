#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run), or its quick part:
#
#   scripts/test.sh                 lints, Rust tests, fuzz replay, then the
#                                   integration tests that run `warren up` as
#                                   root against the real kernel
#   scripts/test.sh --quick         the inner loop: Rust unit tests and the
#                                   integration tests marked `smoke`
#   scripts/test.sh [--quick] ARGS  ARGS go to every pytest phase (-k exec, -x)
#
# Installs what it needs first. docs/testing.md says how the suite is
# organised: markers, what runs where, caches, and the rules.
#
#   WARREN_CACHE=DIR        build outputs under DIR (CI: /var/cache/warren-ci),
#                           so a fresh clone rebuilds only Warren's own crates
#   WARREN_TEST_WORKERS=N   integration tests at once (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run the tests as root: they create namespaces, cgroups and mounts" >&2; exit 1; }
quick=false
if [ "${1:-}" = --quick ]; then
    quick=true
    shift
fi
workers=${WARREN_TEST_WORKERS:-3}
start=$(date +%s)
# Each phase's name and how long it took, printed at the end.
phase() {
    local t=$SECONDS
    echo "== $1" >&2
    "${@:2}"
    timings+=("$(printf '%5ss  %s' $((SECONDS - t)) "$1")")
}
timings=()

phase "install what is missing" scripts/install-deps.sh --test
if [ -n "${WARREN_CACHE:-}" ]; then
    export CARGO_TARGET_DIR=$WARREN_CACHE/target
fi
# The tests find the binaries they run here (tests/conftest.py).
CARGO_TARGET_DIR=$(realpath -m "${CARGO_TARGET_DIR:-target}")
export CARGO_TARGET_DIR

# Sandbox inits running before the tests (another Warren on this machine)
# are not the tests' to answer for; any other one at the end is a leak.
inits_before=$(pgrep -f '^/.warren-init' || true)

# A throw-away PostgreSQL (scripts/pg-temp.sh): with its URL in
# WARREN_TEST_DATABASE_URL the store tests run against PostgreSQL as well
# as SQLite (they fail, never skip, if it cannot be reached). Removed on
# any exit; fsync off, as nothing here tests PostgreSQL's durability.
pg_dir=$(mktemp -d /tmp/warren-pg-XXXXXX)
reports=$(mktemp -d /tmp/warren-reports-XXXXXX)
trap 'scripts/pg-temp.sh stop "$pg_dir"; rm -rf "$reports"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
WARREN_TEST_DATABASE_URL=$(PG_TEMP_OPTS="-c fsync=off" scripts/pg-temp.sh start "$pg_dir")
export WARREN_TEST_DATABASE_URL

# One integration phase: pytest over tests/ with a marker expression, its
# counts in a JUnit report. A selection that holds no test (exit 5) is not
# a failure of the phase.
integration() {
    local name=$1 markers=$2 n=$3
    shift 3
    local par=()
    [ "$n" -gt 1 ] && par=(-n "$n" --dist loadfile)
    local rc=0
    python3 -m pytest -q -p no:cacheprovider --strict-markers "${par[@]}" -m "$markers" \
        --junitxml="$reports/$name.xml" tests "$@" || rc=$?
    [ "$rc" = 5 ] && return 0
    return "$rc"
}
# The control plane drives its node through the node API over loopback
# HTTP, as a cluster's does: the tests marked `contract`, once more.
over_http() {
    WARREN_TEST_UP_ARGS="--node-transport http" integration "$@"
}

if $quick; then
    phase "build" cargo build --workspace --all-targets -q
    phase "rust unit tests" cargo nextest run --workspace --lib --bins --no-fail-fast --status-level fail
    phase "integration: smoke" integration smoke "smoke" "$workers" "$@"
else
    phase "deployment files" scripts/validate-deploy.sh
    phase "fmt" cargo fmt --all -- --check
    phase "clippy" cargo clippy --workspace --all-targets -- -D warnings
    phase "build" cargo build --workspace --all-targets
    phase "rust tests" cargo nextest run --workspace --no-fail-fast --status-level fail
    phase "rust doc tests" cargo test --workspace --doc -q
    # The fuzz targets (fuzz/): every committed seed, corpus input and past
    # crash, once (open-ended fuzzing is `scripts/fuzz.sh explore`, outside CI).
    phase "fuzz replay" scripts/fuzz.sh replay
    phase "integration: parallel" integration parallel "not serial" "$workers" "$@"
    phase "integration: serial" integration serial "serial" 1 "$@"
    phase "integration over HTTP: parallel" over_http http-parallel "contract and not serial" "$workers" "$@"
    phase "integration over HTTP: serial" over_http http-serial "contract and serial" 1 "$@"
fi

# Nothing the tests made may outlive them: every daemon they started has
# stopped, so a sandbox init still running was leaked.
leaked=$(comm -13 <(sort <<<"$inits_before") <(pgrep -f '^/.warren-init' | sort) | grep . || true)
if [ -n "$leaked" ]; then
    for p in $leaked; do
        echo "leaked sandbox init: pid $p, $(grep -m1 pids: "/proc/$p/cgroup" 2>/dev/null || echo gone)" >&2
    done
    exit 1
fi
printf '%s\n' "${timings[@]}" >&2
echo "whole run: $(($(date +%s) - start))s" >&2
# The slowest tests, and the counts of every phase together.
python3 scripts/test-report.py --slowest 20 "$reports"/*.xml
