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
trap 'scripts/pg-temp.sh stop "$pg_dir"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
WARREN_TEST_DATABASE_URL=$(PG_TEMP_OPTS="-c fsync=off" scripts/pg-temp.sh start "$pg_dir")
export WARREN_TEST_DATABASE_URL
cargo test --workspace
# The fuzz targets (fuzz/): every committed seed, corpus input and past
# crash, once (open-ended fuzzing is `scripts/fuzz.sh explore`, outside CI).
scripts/fuzz.sh replay
python3 -m pytest -q tests "$@"
# Again, with every daemon's control plane driving its node through the
# node API over loopback HTTP, as a cluster's control plane does.
WARREN_TEST_UP_ARGS="--node-transport http" python3 -m pytest -q tests "$@"
# Nothing the tests made may outlive them: every daemon they started has
# stopped, so a sandbox init still running was leaked.
leaked=$(comm -13 <(sort <<<"$inits_before") <(pgrep -f '^/.warren-init' | sort) | grep . || true)
if [ -n "$leaked" ]; then
    for p in $leaked; do
        echo "leaked sandbox init: pid $p, $(grep -m1 pids: "/proc/$p/cgroup" 2>/dev/null || echo gone)" >&2
    done
    exit 1
fi
