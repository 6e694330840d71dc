#!/usr/bin/env bash
# `warren build` against `buildah bud`, same Dockerfiles, same contexts, same
# run, each tool with its own copy of one Debian base image (python3 and pip,
# made offline by scripts/make-base-image.sh):
#
#  1. rebuild: a Dockerfile whose dependency step writes a 300 MiB layer
#     (random bytes: nothing compresses), then COPY of the code. After one
#     build, one line of the code changes and the image is built again,
#     timed end to end (every earlier step a cache hit).
#  2. cold: `RUN pip install` of one pure-Python wheel from a local package
#     index, then COPY of the code, with the cache off (--no-cache).
#
#   scripts/bench-build.sh [RUNS]
#
# Needs root, buildah, hyperfine, mmdebstrap and umoci (the base image),
# pip on the host (to fetch the wheel once) and a release build (built
# here). Prints a markdown table.
set -euo pipefail
runs=${1:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -q -p warren --manifest-path "$root/Cargo.toml"
warren=$root/target/release/warren

cache=/var/cache/warren-bench
mkdir -p "$cache"
base_tar=$cache/debian-python3-pip.tar
[ -s "$base_tar" ] || "$root/scripts/make-base-image.sh" "$base_tar" --include python3,python3-pip >/dev/null
wheel_dir=$cache/wheels
[ -n "$(ls "$wheel_dir"/six-*.whl 2>/dev/null)" ] || python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheel_dir" six==1.16.0

work=$(mktemp -d /tmp/warren-bench-build.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    buildah rm --all >/dev/null 2>&1 || true
    buildah rmi --force bench-rebuild bench-cold >/dev/null 2>&1 || true
    buildah rmi --prune >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

. "$root/scripts/lib/registry.sh"

# The package index: PEP 503 "simple" pages over the wheel, on an address
# of its own (Warren's RUN reaches it through --allow; buildah's with the
# host's network).
index_ip=127.0.0.14
index_port=$(port)
mkdir -p "$work/index/simple/six"
cp "$wheel_dir"/six-*.whl "$work/index/simple/six/"
whl=$(basename "$wheel_dir"/six-*.whl)
printf '<a href="six/">six</a>\n' >"$work/index/simple/index.html"
printf '<a href="%s">%s</a>\n' "$whl" "$whl" >"$work/index/simple/six/index.html"
(cd "$work/index" && exec python3 -m http.server "$index_port" --bind "$index_ip" >/dev/null 2>&1) &
pids+=($!)
wait_http "http://$index_ip:$index_port/simple/"

# Warren with its own home and the base image.
api_port=$(port)
mkdir "$work/home"
printf 'unqualified-search-registries = []\n' >"$work/home/registries.toml"
"$warren" up --home "$work/home" --listen "127.0.0.1:$api_port" --net-resolve "index.test=$index_ip" >"$work/warren.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$api_port/healthz"
export WARREN_URL=http://127.0.0.1:$api_port WARREN_HOME=$work/home
"$warren" image import "$base_tar" --name bench-base:1 >/dev/null
buildah_base=$(buildah pull -q "oci-archive:$base_tar")

# 1. Rebuild after a one-line change (300 MiB dependency layer).
mkdir -p "$work/rebuild/app"
cat >"$work/rebuild/Dockerfile" <<'EOF'
ARG BASE
FROM $BASE
RUN head -c 314572800 /dev/urandom > /opt/deps.bin
COPY app/ /app/
CMD ["python3", "/app/main.py"]
EOF
for i in $(seq 20); do echo "print('line $i')" >>"$work/rebuild/app/main.py"; done
"$warren" build -q -t bench-rebuild:1 --build-arg BASE=bench-base:1 "$work/rebuild" >/dev/null
buildah bud -q --layers --build-arg BASE="$buildah_base" -t bench-rebuild "$work/rebuild" >/dev/null
# A new first line each time (hyperfine's shell is sh: no $RANDOM).
change="sed -i \"1s/.*/print('changed \$(date +%s%N)')/\" $work/rebuild/app/main.py"
trap 'echo "failed; warren log tail:" >&2; tail -n 20 "$work/warren.log" >&2; cleanup' ERR
hyperfine --style none --runs "$runs" --export-json "$work/rebuild.json" \
    --prepare "$change" \
    -n "warren build (rebuild)" "$warren build -q -t bench-rebuild:1 --build-arg BASE=bench-base:1 $work/rebuild" \
    --prepare "$change" \
    -n "buildah bud --layers (rebuild)" "buildah bud -q --layers --build-arg BASE=$buildah_base -t bench-rebuild $work/rebuild" \
    >/dev/null
"$warren" run --rm --image bench-rebuild:1 -- python3 /app/main.py | head -n1 | grep -q changed

# 2. Cold build of a small Python image.
mkdir -p "$work/cold/app"
echo "import six; print(six.__version__)" >"$work/cold/app/main.py"
cat >"$work/cold/Dockerfile" <<EOF
ARG BASE
FROM \$BASE
RUN python3 -m pip install --break-system-packages --no-cache-dir --trusted-host index.test --index-url http://index.test:$index_port/simple/ six
COPY app/ /app/
CMD ["python3", "/app/main.py"]
EOF
hyperfine --style none --runs "$runs" --warmup 1 --export-json "$work/cold.json" \
    -n "warren build --no-cache (cold)" "$warren build -q --no-cache -t bench-cold:1 --build-arg BASE=bench-base:1 --allow index.test:$index_port $work/cold" \
    -n "buildah bud --no-cache (cold)" "buildah bud -q --no-cache --network host --add-host index.test:$index_ip --build-arg BASE=$buildah_base -t bench-cold $work/cold" \
    >/dev/null
[ "$("$warren" run --rm --image bench-cold:1 -- python3 /app/main.py)" = 1.16.0 ]

python3 - "$work/rebuild.json" "$work/cold.json" <<'EOF'
import json, sys
print("| build | mean (s) | min (s) | max (s) |")
print("|---|---|---|---|")
pairs = []
for path in sys.argv[1:]:
    rs = json.load(open(path))["results"]
    for r in rs:
        print(f"| {r['command']} | {r['mean']:.2f} | {r['min']:.2f} | {r['max']:.2f} |")
    pairs.append((rs[0]["command"], rs[0]["mean"] / rs[1]["mean"]))
for name, ratio in pairs:
    print(f"\n{name}: {ratio:.2f}x buildah's time")
EOF
