#!/usr/bin/env bash
# A cluster on one host, to try one before deploying it (docs/cluster.md):
# a throw-away PostgreSQL, a `warren server` on it and two `warren node`
# agents (a and b, 1 CPU and 1G each), every one with its own home and port
# under one directory, then sandboxes placed across both nodes. It leaves
# the cluster running until Ctrl-C, which stops everything and removes the
# directory. Run as root on Debian.
#
#   scripts/cluster-demo.sh
#
# It runs WARREN_BIN, else the installed `warren`, else builds one from this
# checkout; PostgreSQL is Debian's (installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: sandboxes need namespaces, cgroups and mounts" >&2; exit 1; }
command -v pg_ctlcluster >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    || { echo "== installing PostgreSQL"; DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; }
bin=${WARREN_BIN:-$(command -v warren || true)}
if [ -z "$bin" ]; then
    scripts/install-deps.sh
    echo "== building warren (release; the first build takes about 10 minutes)"
    cargo build --release -p warren
    bin=$PWD/target/release/warren
fi
# Searchable by the user `postgres` (the database runs as it).
dir=$(mktemp -d /tmp/warren-cluster-demo.XXXXXX)
chmod 755 "$dir"
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
stop() {
    trap - EXIT INT TERM
    echo "== stopping the cluster"
    if [ -n "$url" ]; then
        WARREN_URL=$url WARREN_HOME=$dir/server "$bin" rm --label demo=cluster >/dev/null \
            || echo "removing the demo's sandboxes failed; the nodes keep them" >&2
    fi
    # Nodes first (each takes its sandboxes' cgroups with it), then the server.
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    scripts/pg-temp.sh stop "$dir/pg" >/dev/null 2>&1 || true
    rm -rf "$dir"
    echo "stopped; $dir removed"
}
url=
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT

echo "== PostgreSQL in $dir/pg"
database=$(scripts/pg-temp.sh start "$dir/pg")
sport=$(port)
url=http://127.0.0.1:$sport
echo "== warren server at $url (home $dir/server)"
mkdir -m 0700 "$dir/server"
# setsid: Ctrl-C signals the terminal's whole process group; the daemons
# stop in order from the trap instead (sandboxes first, then nodes, then
# the server), as scripts/demo.sh does.
setsid "$bin" server --home "$dir/server" --listen "127.0.0.1:$sport" --database "$database" \
    > "$dir/server.log" 2>&1 &
pids=("$!" "${pids[@]}")
for _ in $(seq 300); do curl -sf "$url/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "$url/healthz" >/dev/null || { cat "$dir/server.log" >&2; echo "the server did not start" >&2; exit 1; }
"$bin" server join-token --home "$dir/server" > "$dir/join-token"
for n in a b; do
    nport=$(port)
    echo "== warren node $n at 127.0.0.1:$nport (home $dir/$n)"
    mkdir -m 0700 "$dir/$n"
    setsid "$bin" node --home "$dir/$n" --server "$url" --join-token "$dir/join-token" \
        --listen "127.0.0.1:$nport" --name "$n" --label "zone=$n" \
        --capacity-cpu 1 --capacity-memory 1G --cgroup-parent "warren/cluster-demo-$$-$n" \
        > "$dir/node-$n.log" 2>&1 &
    # Nodes are stopped before the server.
    pids=("$!" "${pids[@]}")
done
export WARREN_URL=$url WARREN_HOME=$dir/server
ready=
for _ in $(seq 300); do
    if [ "$("$bin" node ls 2>/dev/null | grep -c ' ready ')" = 2 ]; then ready=1; break; fi
    sleep 0.1
done
[ -n "$ready" ] || { cat "$dir"/node-*.log >&2; echo "the nodes did not join" >&2; exit 1; }
"$bin" node ls
img=$dir/busybox.tar
scripts/make-busybox-image.sh "$img" >/dev/null
echo "== importing a busybox image (onto both nodes)"
"$bin" image import "$img" --name busybox:latest
echo "== four sandboxes of half a CPU: placement spreads them over a and b"
for i in 1 2 3 4; do
    "$bin" create --image busybox:latest --cpu 0.5 --memory 64M --label demo=cluster >/dev/null
done
# sed, not head: see scripts/demo.sh.
"$bin" ps --label demo=cluster | sed -n 1,6p
"$bin" node ls
echo
echo "The cluster is running. In another shell:"
echo "  WARREN_URL=$url WARREN_HOME=$dir/server $bin ps"
echo "Press Ctrl-C to stop it."
wait
