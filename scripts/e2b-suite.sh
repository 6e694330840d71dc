#!/usr/bin/env bash
# Runs E2B's own Python SDK test suite (packages/python-sdk/tests of the
# e2b-dev/E2B repository) against Warren's E2B doors, as an E2B user moving
# to Warren would, and prints the counts (docs/e2b.md records them).
#
#   scripts/e2b-suite.sh E2B_CHECKOUT [PYTEST_ARGS...]
#
# E2B_CHECKOUT is a clone of github.com/e2b-dev/E2B (this machine reaches
# no GitHub; bring one). The SDK is installed from that checkout into a
# venv, the template `base` is E2B's base made offline
# (scripts/make-base-image.sh --e2b-user), and a `warren up` of the build
# in target/debug (WARREN_BIN to choose) serves the E2B API and sandbox
# doors on loopback. Out of scope, and left out (docs/e2b.md says why):
# template builds (issue 39) and get_host's public names.
# WARREN_UP_ARGS adds flags to that `warren up` (split on whitespace), e.g.
# WARREN_UP_ARGS="--default-isolation gvisor" runs every sandbox on gVisor;
# E2B_KEEP_LOG=DIR keeps the pytest and warren logs (and the daemon's
# warren-up.log) there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repo=${1:?usage: e2b-suite.sh E2B_CHECKOUT [PYTEST_ARGS...]}
shift
repo=$(cd "$repo" && pwd)
sdk="$repo/packages/python-sdk"
[ -d "$sdk/tests" ] || { echo "$repo has no packages/python-sdk/tests" >&2; exit 2; }
warren=${WARREN_BIN:-$here/target/debug/warren}
cache=${WARREN_TEST_CACHE:-/var/cache/warren-tests}
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)

venv="$cache/venvs/e2b-suite-$commit"
if [ ! -x "$venv/bin/pytest" ]; then
    echo "== a venv with the checkout's SDK ($venv)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "$sdk" "pytest>=9,<10" "pytest-asyncio>=1.3,<2" pytest-timeout python-dotenv pytest-dotenv
fi
# shellcheck source=lib/e2b-warren.sh
. "$here/scripts/lib/e2b-warren.sh"
work=$(mktemp -d)
cleanup() {
    stop_e2b_warren
    [ -z "${E2B_KEEP_LOG:-}" ] || cp "$work/warren.log" "$work/home/warren-up.log" "$work/pytest.log" "$E2B_KEEP_LOG/" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
start_e2b_warren "$work" e2b-suite

[ $# -gt 0 ] || set -- tests/sync tests/async
echo "== E2B's SDK tests ($commit) against Warren"
cd "$sdk"
set +e
"$venv/bin/pytest" -q -p no:cacheprovider --timeout 60 -rf \
    --ignore tests/sync/template_sync --ignore tests/async/template_async \
    --ignore tests/sync/sandbox_sync/test_host.py --ignore tests/async/sandbox_async/test_host.py \
    "$@" | tee "$work/pytest.log" | tail -n 200
status=${PIPESTATUS[0]}
set -e
summary=$(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$work/pytest.log" | tail -1)
echo "e2b-suite: E2B $commit, Warren $(git -C "$here" rev-parse --short HEAD)${WARREN_UP_ARGS:+ ($WARREN_UP_ARGS)}: $summary"
exit "$status"
