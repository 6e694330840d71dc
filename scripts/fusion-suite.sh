#!/usr/bin/env bash
# Runs SandboxFusion's own runner tests (sandbox/tests/runners of the
# bytedance/SandboxFusion repository), unchanged, against Warren's
# SandboxFusion door (`warren up --sandbox-fusion`), and prints the counts
# (docs/sandbox-fusion.md records them). Outside CI: it builds an image of
# toolchains once (cached; 1.2 GB, 3.5 GB unpacked, 4-7 minutes), imports it
# into a `warren up` of its own (~4 minutes on the 2-core machine) and runs
# ~90 calls (~1.5 minutes).
#
#   scripts/fusion-suite.sh SANDBOXFUSION_CHECKOUT [PYTEST_ARGS...]
#
# SANDBOXFUSION_CHECKOUT is a clone of github.com/bytedance/SandboxFusion, or
# a bare git directory of one (its HEAD is used); this machine reaches no
# GitHub, so bring one. The tests talk to SandboxFusion's FastAPI app
# in-process through FastAPI's TestClient; scripts/lib/fusion_suite_plugin.py
# makes that client an HTTP client of Warren's door instead, and never starts
# SandboxFusion's server. The tests' request and response models are
# SandboxFusion's own, from the checkout.
#
# The image is Debian bookworm with the toolchains Debian has for
# SandboxFusion's languages (scripts/make-base-image.sh), plus tsx from npm
# (SandboxFusion's own image installs it the same way). A language Warren
# does not run (422) or whose toolchain Debian lacks (julia, swift) is
# skipped with its reason; the known gaps are strict xfails (the plugin's
# KNOWN). Everything else must pass.
#
# Environment: WARREN_BIN (default target/debug/warren), WARREN_TEST_CACHE
# (default /var/cache/warren-tests), FUSION_SUITE_IMAGE=FILE.tar to use an
# image of your own (the REQUIRE check is then off).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=${1:?usage: fusion-suite.sh SANDBOXFUSION_CHECKOUT [PYTEST_ARGS...]}
shift
src=$(cd "$src" && pwd)
warren=${WARREN_BIN:-$here/target/debug/warren}
warren_tree=$(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)
cache=${WARREN_TEST_CACHE:-/var/cache/warren-tests}
[ -x "$warren" ] || { echo "no Warren binary at $warren (cargo build, or set WARREN_BIN)" >&2; exit 2; }

work=$(mktemp -d)
daemon=
cleanup() {
    [ -n "$daemon" ] && { kill -INT "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT

# The checkout: a work tree, or a bare git directory (as the search tool's
# fetch gives) unpacked at its HEAD.
if [ -d "$src/sandbox/tests/runners" ]; then
    sf=$src
    commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
elif git --git-dir "$src" rev-parse --verify -q HEAD >/dev/null; then
    sf=$work/sandboxfusion
    mkdir "$sf"
    git --git-dir "$src" archive HEAD | tar -x -C "$sf"
    commit=$(git --git-dir "$src" rev-parse --short HEAD)
else
    echo "$src is neither a SandboxFusion work tree nor a git directory of one" >&2
    exit 2
fi
[ -d "$sf/sandbox/tests/runners" ] || { echo "$src has no sandbox/tests/runners" >&2; exit 2; }

# The test side: SandboxFusion's models and test deps, pinned to its
# pyproject's ranges (pydantic <2.7, fastapi 0.103, pytest-asyncio 0.23 for
# its package-scoped asyncio mark). Not SandboxFusion's server deps: its
# server is never imported.
pins=("pydantic>=2.4,<2.7" "fastapi>=0.103.1,<0.104" "httpx>=0.26,<0.28" "structlog>=23.1,<24"
      "psutil>=5.9.8,<6" "aiofiles>=23.2.1,<24" "pyyaml>=6,<7"
      "pytest>=7.4.2,<8.4" "pytest-asyncio==0.23.8" "pytest-timeout>=2.3,<3" "pytest-xdist>=3.6,<4")
venv="$cache/venvs/fusion-suite-$(printf '%s\n' "${pins[@]}" | sha256sum | cut -c1-12)"
if [ ! -x "$venv/bin/pytest" ]; then
    echo "== a venv for SandboxFusion's tests ($venv)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "${pins[@]}" || { rm -rf "$venv"; exit 1; }
fi

# The image: Debian's toolchains for SandboxFusion's languages.
#   python/pytest/jupyter: python3 python3-pytest python3-requests (test_isolation)
#     python3-matplotlib python3-ipykernel python3-jupyter-client (test_jupyter_plot)
#   cpp: g++   go: golang-go (1.19)   rust: rustc (1.63)
#   java: default-jdk-headless (17), libjavatuples-java in /opt/sandbox-fusion/java
#   nodejs/typescript: nodejs (18) + lodash, and tsx from npm (Debian has none)
#   php: php-cli (php8.2-readline comes with it)   lua: lua5.4 lua-unit
#   perl: libtest-deep-perl libdata-compare-perl   ruby: ruby ruby-test-unit
#   R: r-base-core   racket: racket   kotlin_script: kotlin (1.3.31, .kts through
#     kotlinc -script)   D_ut: ldc (as dmd)
# Not in Debian bookworm: julia, swift (their tests are skipped).
require=python,pytest,bash,cpp,go,java,rust,nodejs,typescript,php,lua,perl,ruby,R,racket,kotlin_script,D_ut,jupyter
include=python3,python3-pytest,python3-requests,python3-matplotlib,python3-ipykernel,python3-jupyter-client
include+=,bash,g++,golang-go,default-jdk-headless,libjavatuples-java,rustc,nodejs,node-lodash,php-cli
include+=,lua5.4,lua-unit,perl,libtest-deep-perl,libdata-compare-perl,ruby,ruby-test-unit
include+=,r-base-core,racket,kotlin,ldc,ca-certificates
tsx="tsx@4.7.1"   # SandboxFusion's scripts/Dockerfile.base pins the same
hooks=(
    # No /etc/hosts (mmdebstrap writes none): Warren's init writes one where
    # the image has none (docs/network.md), which
    # test_isolation_network_server_localhost checks.
    # The command names SandboxFusion's runners call: lua, pytest, dmd.
    '[ -e "$1/usr/bin/lua" ] || ln -s /usr/bin/lua5.4 "$1/usr/local/bin/lua"'
    '[ -e "$1/usr/bin/pytest" ] || ln -s /usr/bin/pytest-3 "$1/usr/local/bin/pytest"'
    'ln -s /usr/bin/ldmd2 "$1/usr/local/bin/dmd"'
    # Debian's Kotlin (1.3.31) says "running Kotlin scripts is not yet
    # supported" to `kotlin F.kts`, which SandboxFusion's Kotlin (2.0) runs:
    # the runner name stays, and a .kts goes to `kotlinc -script`.
    'printf "#!/bin/sh\ncase \"\$1\" in *.kts) exec kotlinc -script \"\$@\";; esac\nexec /usr/bin/kotlin \"\$@\"\n" > "$1/usr/local/bin/kotlin" && chmod 0755 "$1/usr/local/bin/kotlin"'
    # The jars Warren's Java class path ends with, as SandboxFusion bundles
    # javatuples-1.2.jar (test_java_external_jar).
    'mkdir -p "$1/opt/sandbox-fusion/java" && cp "$1/usr/share/java/javatuples.jar" "$1/opt/sandbox-fusion/java/javatuples-1.2.jar"'
    # require("lodash") and import "lodash" from /tmp/tmpXXXX find /node_modules
    # (SandboxFusion links its own node_modules into each call's directory).
    'ln -s /usr/share/nodejs "$1/node_modules"'
    # tsx (and its esbuild binary) from the npm registry, with the host's npm
    # and its registry settings, into the image's /usr/local.
    "npm install -g --prefix \"\$1/usr/local\" --no-audit --no-fund --loglevel=error $tsx"
)
image=${FUSION_SUITE_IMAGE:-}
if [ -z "$image" ]; then
    command -v npm >/dev/null || { echo "npm is needed to put tsx in the image (apt-get install npm)" >&2; exit 2; }
    key=$(printf '%s\n' "$include" "${hooks[@]}" | sha256sum | cut -c1-12)
    image="$cache/fusion-suite-bookworm-$key-oci.tar"
    if [ ! -f "$image" ]; then
        mkdir -p "$cache"
        # One build at a time (the tests' cache entries lock the same way).
        exec 9>"$image.lock"
        flock 9
        if [ ! -f "$image" ]; then
            echo "== the toolchain image, once ($image; several minutes)"
            args=()
            for h in "${hooks[@]}"; do args+=(--hook "$h"); done
            "$here/scripts/make-base-image.sh" "$image" --include "$include" --tag deb "${args[@]}"
        fi
        exec 9>&-
    fi
else
    require=
fi

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api=$(port) door=$(port)
mkdir -m 0700 "$work/home"
printf 'unqualified-search-registries = []\n' > "$work/home/registries.toml"
"$warren" up --home "$work/home" --listen "127.0.0.1:$api" --cgroup-parent "warren/fusion-suite-$$" \
    --sandbox-fusion "127.0.0.1:$door" --sandbox-fusion-image fusion-suite:1 > "$work/warren.log" 2>&1 &
daemon=$!
up=0
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$api/healthz" | grep -q ok && { up=1; break; }
    kill -0 "$daemon" 2>/dev/null || break
    sleep 0.1
done
[ "$up" = 1 ] || { echo "warren up did not come up:" >&2; tail -n 40 "$work/warren.log" >&2; exit 1; }
echo "== importing the image"
WARREN_URL="http://127.0.0.1:$api" "$warren" --home "$work/home" image import "$image" --name fusion-suite:1 >/dev/null

[ $# -gt 0 ] || set -- sandbox/tests/runners
echo "== SandboxFusion's runner tests ($commit) against Warren's door"
cd "$sf"
export PYTHONPATH="$sf:$here/scripts/lib"
export WARREN_FUSION_URL="http://127.0.0.1:$door" WARREN_FUSION_REQUIRE="$require"
set +e
# -o addopts= drops SandboxFusion's coverage options (pytest-cov is not
# installed); its pyproject still gives asyncio_mode=auto and the markers.
"$venv/bin/pytest" -p fusion_suite_plugin -p no:cacheprovider -p no:logging -o addopts= \
    --ignore=sandbox/tests/runners/samples --timeout 300 -q -rfEsxX "$@" \
    | tee "$work/pytest.log" | tail -n 200
status=${PIPESTATUS[0]}
set -e
summary=$(grep -E '(passed|failed|skipped)' "$work/pytest.log" | tail -1)
echo "fusion-suite: SandboxFusion $commit, Warren $warren_tree: $summary"
if [ "$status" -ne 0 ]; then
    echo "== warren log tail" && tail -n 40 "$work/warren.log"
fi
exit "$status"
