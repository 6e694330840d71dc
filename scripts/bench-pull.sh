#!/usr/bin/env bash
# Pull of a multi-layer image from a local registry: `warren image pull`
# (download, verify, unpack every layer) against `skopeo copy` of the same
# image to a local directory (download and verify only), in the same run.
# Then `warren commit` of a sandbox that wrote 10 MiB of random bytes, and
# create latency (`warren-bench lifecycle`) from a small and a 300 MiB image, both
# pulled, both named by registry reference (so every create asks the
# registry for the tag's digest).
#
#   scripts/bench-pull.sh [RUNS] [MB_PER_LAYER]
#
# Needs root, docker-registry, skopeo, umoci, hyperfine (scripts/install-deps.sh --test)
# and a release build (built here). Prints a markdown table.
set -euo pipefail
runs=${1:-5}
mb=${2:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -q -p warren -p warren-bench --manifest-path "$root/Cargo.toml"
warren=$root/target/release/warren
bench=$root/target/release/warren-bench

work=$(mktemp -d /tmp/warren-bench-pull.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

. "$root/scripts/lib/registry.sh"

# The registry, plain HTTP on loopback.
start_registry "$work/registry"

# busybox plus four layers: two of random bytes (gzip cannot shrink them) and
# two of base64 text (it shrinks to about 3/4), MB_PER_LAYER each.
"$root/scripts/make-busybox-image.sh" "$work/busybox.tar" >/dev/null
mkdir "$work/oci" && tar -C "$work/oci" -xf "$work/busybox.tar"
tag=latest
for i in 1 2 3 4; do
    umoci unpack --image "$work/oci:$tag" "$work/bundle" >/dev/null
    if [ $((i % 2)) -eq 1 ]; then
        head -c $((mb << 20)) /dev/urandom >"$work/bundle/rootfs/random-$i"
    else
        python3 -c 'import base64, os, sys; sys.stdout.write(base64.b64encode(os.urandom(int(sys.argv[1]) * 3 // 4)).decode())' \
            $((mb << 20)) >"$work/bundle/rootfs/text-$i"
    fi
    umoci repack --image "$work/oci:l$i" "$work/bundle" >/dev/null
    rm -rf "$work/bundle"
    tag=l$i
done
ref=127.0.0.1:$reg_port/bench:v1
skopeo copy -q --dest-tls-verify=false "oci:$work/oci:$tag" "docker://$ref"
compressed=$(skopeo inspect --raw --tls-verify=false "docker://$ref" | python3 -c 'import json,sys; print(sum(l["size"] for l in json.load(sys.stdin)["layers"]))')

# Warren with its own home.
api_port=$(port)
mkdir "$work/home"
printf '[registry."127.0.0.1:%s"]\ninsecure = true\n' "$reg_port" >"$work/home/registries.toml"
"$warren" up --home "$work/home" --listen "127.0.0.1:$api_port" >"$work/warren.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$api_port/healthz"
export WARREN_URL=http://127.0.0.1:$api_port WARREN_HOME=$work/home

hyperfine --style none --runs "$runs" --warmup 1 --export-json "$work/times.json" \
    --prepare "$warren image rm $ref >/dev/null 2>&1 || true" \
    -n "warren image pull" "$warren image pull -q $ref" \
    --prepare "rm -rf $work/skopeo-dir" \
    -n "skopeo copy to dir:" "skopeo copy -q --src-tls-verify=false docker://$ref dir:$work/skopeo-dir" \
    >/dev/null

# Commit: a sandbox from the pulled image writes 10 MiB; each run commits
# it anew (tar, gzip, diffID, unpack into a snapshot, record).
"$warren" image pull -q "$ref" >/dev/null
sbx=$("$warren" create --image "$ref" --ttl 10m)
"$warren" exec "$sbx" -- sh -c 'head -c 10485760 /dev/urandom > /change.bin'
hyperfine --style none --runs "$runs" --warmup 1 --export-json "$work/commit.json" \
    -n "warren commit (10 MiB change)" "$warren commit $sbx bench/task:v1" >/dev/null
"$warren" rm "$sbx" >/dev/null

# Create latency against image size: busybox + 4 MiB, and busybox + 2 x 150 MiB.
build_sized() { # NAME MIB...
    local name=$1 t=latest n=0
    shift
    rm -rf "$work/$name" && mkdir "$work/$name" && tar -C "$work/$name" -xf "$work/busybox.tar"
    for size in "$@"; do
        n=$((n + 1))
        umoci unpack --image "$work/$name:$t" "$work/bundle" >/dev/null
        head -c $((size << 20)) /dev/urandom >"$work/bundle/rootfs/blob-$n"
        umoci repack --image "$work/$name:s$n" "$work/bundle" >/dev/null
        rm -rf "$work/bundle"
        t=s$n
    done
    skopeo copy -q --dest-tls-verify=false "oci:$work/$name:$t" "docker://127.0.0.1:$reg_port/$name:v1"
    "$warren" image pull -q "127.0.0.1:$reg_port/$name:v1" >/dev/null
}
build_sized small 4
build_sized large 150 150
# The small image once more by digest: no registry round trip per create.
small_digest=$("$warren" image pull -q "127.0.0.1:$reg_port/small:v1" | awk '{print $2}')
for name in small large "small@$small_digest"; do
    ref=127.0.0.1:$reg_port/$name
    [[ $name == *@* ]] || ref=$ref:v1
    "$bench" lifecycle --image "$ref" --iterations 10 --concurrency 1 --idle 0 --json \
        >"$work/create-${name%%@*}$([[ $name == *@* ]] && echo -digest).json"
done

python3 - "$work/times.json" "$compressed" "$mb" "$runs" "$work/commit.json" "$work" <<'EOF'
import json, statistics, sys
results = {r["command"]: r for r in json.load(open(sys.argv[1]))["results"]}
mb, runs = sys.argv[3], sys.argv[4]
print(f"image: busybox + 4 layers of {mb} MiB (2 random, 2 text), {int(sys.argv[2]) / 2**20:.1f} MiB compressed; {runs} runs each")
print()
print("| command | median s | min s | max s | vs skopeo |")
print("|---|---:|---:|---:|---:|")
base = statistics.median(results["skopeo copy to dir:"]["times"])
for name in ("warren image pull", "skopeo copy to dir:"):
    t = results[name]["times"]
    print(f"| {name} | {statistics.median(t):.3f} | {min(t):.3f} | {max(t):.3f} | {statistics.median(t) / base:.2f}x |")
t = json.load(open(sys.argv[5]))["results"][0]["times"]
print()
print("| command | median s | min s | max s |")
print("|---|---:|---:|---:|")
print(f"| warren commit (10 MiB change) | {statistics.median(t):.3f} | {min(t):.3f} | {max(t):.3f} |")
print()
print("| image | create_to_ready n | p50 ms | p99 ms |")
print("|---|---:|---:|---:|")
for name, label in (
    ("small", "busybox + 4 MiB, by tag"),
    ("large", "busybox + 2 x 150 MiB, by tag"),
    ("small-digest", "busybox + 4 MiB, by digest (no registry round trip)"),
):
    rows = json.load(open(f"{sys.argv[6]}/create-{name}.json"))
    rows = rows["results"] if isinstance(rows, dict) else rows
    c = next(r for r in rows if r["name"] == "create_to_ready")
    print(f"| {label} | {c['n']} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} |")
EOF
