#!/usr/bin/env bash
# Installs Warren on this machine, as root: what it needs from Debian, a
# release build (the first one takes about 10 minutes), `warren` on PATH
# and a systemd unit for `warren up` (deploy/systemd/warren-up.service).
#   scripts/install.sh
# PREFIX (default /usr/local): warren goes to $PREFIX/bin.
# SYSTEMD_DIR (default /etc/systemd/system): where the unit goes.
# WARREN_BIN=PATH installs that binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: warren up needs namespaces, cgroups and mounts, and this writes to ${PREFIX:-/usr/local}" >&2; exit 1; }
prefix=${PREFIX:-/usr/local}
units=${SYSTEMD_DIR:-/etc/systemd/system}
bin=${WARREN_BIN:-}
if [ -z "$bin" ]; then
    scripts/install-deps.sh
    echo "== building warren (release; the first build takes about 10 minutes)"
    cargo build --release -p warren
    bin=target/release/warren
fi
install -D -m 0755 "$bin" "$prefix/bin/warren"
mkdir -p "$units"
sed "s#/usr/local/bin/warren#$prefix/bin/warren#" deploy/systemd/warren-up.service >"$units/warren-up.service"
chmod 0644 "$units/warren-up.service"
# Only a running systemd can load the unit; without one (a container),
# `warren up &` starts the daemon.
if [ "$units" = /etc/systemd/system ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "installed $prefix/bin/warren ($("$prefix/bin/warren" --version)) and $units/warren-up.service"
case ":$PATH:" in
*":$prefix/bin:"*) ;;
*) echo "note: $prefix/bin is not on PATH; add it, or run $prefix/bin/warren" ;;
esac
