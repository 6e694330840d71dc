#!/usr/bin/env bash
# Installs what Warren needs on a fresh Debian machine (run as root). Idempotent.
#   scripts/install-deps.sh          what building and running Warren (and the demo) need
#   scripts/install-deps.sh --test   also what the test suite and the benchmarks need
set -euo pipefail
test=false
[ "${1:-}" = --test ] && test=true
# libseccomp-dev and pkg-config to build; libelf-dev and zlib1g-dev for the
# libbpf that libcontainer's cgroup v2 device rules are built with;
# busybox-static and umoci for the demo's image; e2fsprogs for per-sandbox
# disk limits; curl for the API; libc6-dev's libc.a for the static
# sandbox init (crates/warren-init, built by warren-runtime's build.rs).
pkgs=(libc6-dev libseccomp-dev pkg-config libelf-dev zlib1g-dev busybox-static umoci e2fsprogs curl)
# The tests' comparisons, registries, fault injection and PostgreSQL.
# runsc (gVisor) for the gvisor isolation class (tests/test_gvisor.py).
$test && pkgs+=(skopeo runc bubblewrap podman hyperfine iproute2 nftables docker-registry nginx-light apache2-utils zstd mmdebstrap postgresql runsc)
# The web console's browser tests (tests/test_console.py): Debian's Chromium,
# driven by Playwright for Python (its own browsers are never downloaded).
$test && pkgs+=(chromium)
need=()
# Debian's python3 refuses pip installs outside a venv (PEP 668) unless told.
pip_install() { python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"; }
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in "${pkgs[@]}"; do
    have "$p" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
    echo "cargo is missing: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
$test || exit 0
# The fuzz targets (fuzz/, run briefly by scripts/test.sh) need nightly and cargo-fuzz.
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
# The Rust tests run under nextest (each test its own process, all at once).
cargo nextest --version >/dev/null 2>&1 || cargo install cargo-nextest --locked
# pytest-xdist runs the integration tests side by side (scripts/test.sh).
python3 -c "import pytest, xdist, httpx, prometheus_client, mypy, playwright" 2>/dev/null ||
    pip_install pytest pytest-xdist httpx prometheus-client mypy playwright
# The Python SDK (sdk/python), installed as users install it; reinstalled on
# every run so the tests never see a stale copy.
pip_install --force-reinstall --no-deps "$(dirname "$0")/../sdk/python"
