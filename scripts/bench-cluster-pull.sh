#!/usr/bin/env bash
# One pull per cluster: four nodes (a `warren server` and four `warren node`
# agents, each with its own home and port) prewarm one image at once through
# the pull-through cache of deploy/registry-cache (nginx), against one node
# (`warren up`) pulling the same image straight from the upstream registry.
# The cache starts empty before every four-node run. Prints a markdown
# table: times, and the bytes the upstream registry served in each run.
#
#   scripts/bench-cluster-pull.sh [RUNS] [MIB_PER_LAYER]   (4 layers)
#
# Needs root, docker-registry, nginx, skopeo, umoci (scripts/install-deps.sh
# --test) and a release build (built here).
set -euo pipefail
runs=${1:-3}
mb=${2:-125}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -q -p warren --manifest-path "$root/Cargo.toml"
warren=$root/target/release/warren

work=$(mktemp -d /tmp/warren-bench-cluster-pull.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
. "$root/scripts/lib/registry.sh"
now() { date +%s%N; }
# Seconds since $1 (from now), as a decimal.
since() { local ns=$(( $(now) - $1 )); printf "%d.%03d" $((ns / 1000000000)) $((ns / 1000000 % 1000)); }

# The upstream registry, with its access log: the bytes it serves.
start_registry "$work/up" access
up_port=$reg_port
served() { { grep -oE '"GET /v2/[^ ]*/blobs/[^ ]* HTTP/1\.[01]" 200 [0-9]+' "$work/up/registry.log" || true; } | awk '{s+=$NF} END {printf "%.0f\n", s}'; }

# busybox plus four layers of random bytes.
"$root/scripts/make-busybox-image.sh" "$work/busybox.tar" >/dev/null
mkdir "$work/oci" && tar -C "$work/oci" -xf "$work/busybox.tar"
tag=latest
for i in 1 2 3 4; do
    umoci unpack --image "$work/oci:$tag" "$work/bundle" >/dev/null
    head -c $((mb << 20)) /dev/urandom >"$work/bundle/rootfs/layer-$i"
    umoci repack --image "$work/oci:l$i" "$work/bundle" >/dev/null
    rm -rf "$work/bundle"
    tag=l$i
done
ref=127.0.0.1:$up_port/bench/big:v1
skopeo copy -q --dest-tls-verify=false "oci:$work/oci:$tag" "docker://$ref"
rm -rf "$work/oci" "$work/busybox.tar"

# The cache, as deploy/ ships it, with the addresses and paths written in.
cache_port=$(port)
start_cache() {
    rm -rf "$work/cache"
    mkdir -p "$work/cache"
    sed -e "s#https://UPSTREAM#http://127.0.0.1:$up_port#; s#Host UPSTREAM#Host 127.0.0.1:$up_port#" \
        -e "s#listen 5000#listen 127.0.0.1:$cache_port#; s#/var/cache/warren-registry-cache#$work/cache/data#" \
        -e "s#/var/log/warren-registry-cache.log#$work/cache/access.log#; s#/run/warren-registry-cache.pid#$work/cache/nginx.pid#" \
        "$root/deploy/registry-cache/nginx.conf" | sed '1i daemon off;' >"$work/cache/nginx.conf"
    nginx -c "$work/cache/nginx.conf" -p "$work/cache" >"$work/cache/nginx.log" 2>&1 &
    cache_pid=$!
    wait_http "http://127.0.0.1:$cache_port/v2/"
}
stop_cache() { kill "$cache_pid"; wait "$cache_pid" 2>/dev/null || true; }

# One node, straight from the upstream.
single_port=$(port)
mkdir -p "$work/single"
printf 'unqualified-search-registries = []\n[registry."127.0.0.1:%s"]\ninsecure = true\n' "$up_port" >"$work/single/registries.toml"
"$warren" up --home "$work/single" --listen "127.0.0.1:$single_port" >"$work/single.log" 2>&1 &
single_pid=$!
wait_http "http://127.0.0.1:$single_port/healthz"
single=()
single_bytes=()
for r in $(seq "$runs"); do
    WARREN_URL=http://127.0.0.1:$single_port WARREN_HOME=$work/single "$warren" image rm "$ref" >/dev/null 2>&1 || true
    before=$(served)
    t0=$(now)
    WARREN_URL=http://127.0.0.1:$single_port WARREN_HOME=$work/single "$warren" image pull -q "$ref" >/dev/null
    single+=("$(since "$t0")")
    single_bytes+=("$(( $(served) - before ))")
done
kill "$single_pid"; wait "$single_pid" 2>/dev/null || true

# Four nodes through the cache.
server_port=$(port)
mkdir -p "$work/server"
"$warren" server --home "$work/server" --listen "127.0.0.1:$server_port" >"$work/server.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$server_port/healthz"
for n in a b c d; do
    mkdir -p "$work/$n"
    printf 'unqualified-search-registries = []\n[registry."127.0.0.1:%s"]\ninsecure = true\nmirrors = ["127.0.0.1:%s"]\n[registry."127.0.0.1:%s"]\ninsecure = true\n' \
        "$up_port" "$cache_port" "$cache_port" >"$work/$n/registries.toml"
    np=$(port)
    "$warren" node --home "$work/$n" --server "http://127.0.0.1:$server_port" --join-token "$work/server/join-token" \
        --name "$n" --listen "127.0.0.1:$np" >"$work/node-$n.log" 2>&1 &
    pids+=($!)
done
export WARREN_URL=http://127.0.0.1:$server_port WARREN_HOME=$work/server
for _ in $(seq 200); do
    [ "$("$warren" node ls 2>/dev/null | grep -c ready || true)" = 4 ] && break
    sleep 0.1
done
four=()
four_bytes=()
for r in $(seq "$runs"); do
    "$warren" image rm "$ref" >/dev/null 2>&1 || true
    start_cache
    before=$(served)
    t0=$(now)
    out=$("$warren" image prewarm "$ref")
    four+=("$(since "$t0")")
    four_bytes+=("$(( $(served) - before ))")
    [ "$(echo "$out" | grep -c .)" = 4 ] || { echo "prewarm reached $(echo "$out" | grep -c .) nodes" >&2; exit 1; }
    stop_cache
done

python3 - "$mb" "${single[*]}" "${single_bytes[*]}" "${four[*]}" "${four_bytes[*]}" <<'EOF'
import statistics, sys
mb = int(sys.argv[1])
s, sb, f, fb = (list(map(float, a.split())) for a in sys.argv[2:])
mib = lambda b: f"{b / 2**20:.0f}"
print(f"image: busybox + 4 layers of {mb} MiB random bytes")
print("| pull | median s | min s | max s | upstream served MiB per run |")
print("|---|---:|---:|---:|---|")
print(f"| one node, straight from upstream | {statistics.median(s):.2f} | {min(s):.2f} | {max(s):.2f} | {', '.join(map(mib, sb))} |")
print(f"| four nodes at once, through the cache (cold) | {statistics.median(f):.2f} | {min(f):.2f} | {max(f):.2f} | {', '.join(map(mib, fb))} |")
print(f"\nfour nodes / one node: {statistics.median(f) / statistics.median(s):.2f}x")
EOF
