#!/usr/bin/env bash
# The GPU check (docs/gpu.md), for a Debian or Ubuntu host with an NVIDIA GPU
# and its driver, run as root:
#   scripts/gpu-check.sh
# It installs what it needs (Warren's build dependencies, NVIDIA's container
# toolkit for nvidia-ctk), builds Warren, writes a CDI spec for the GPUs
# present (nvidia-ctk cdi generate, hooks removed: Warren does not run CDI
# hooks), starts `warren up` on it, and checks:
#   1. warren doctor lists the spec, the GPUs and NVML;
#   2. a sandbox holding one GPU runs nvidia-smi and sees exactly one GPU;
#   3. a CUDA context holding 256 MiB in that sandbox shows in Warren's usage
#      (usage.gpu_memory_bytes, read by NVML and split by cgroup);
#   4. a second sandbox without GPUs sees no /dev/nvidia*;
#   5. the node's capacity counts the GPUs, and the GPU is free again after.
# Environment: WARREN_BIN (a built binary; default: build one), IMAGE (an image
# with glibc and python3, default docker.io/library/python:3.12-slim), PORT.
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: install the NVIDIA driver first" >&2; exit 1; }
nvidia-smi -L

repo=$(cd "$(dirname "$0")/.." && pwd)
image=${IMAGE:-docker.io/library/python:3.12-slim}
port=${PORT:-7390}
work=$(mktemp -d /tmp/warren-gpu-check.XXXXXX)
chmod 755 "$work"
export WARREN_URL=http://127.0.0.1:$port WARREN_HOME=$work/home
failed=0
ok() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; failed=1; }

echo "== installing what is needed"
"$repo/scripts/install-deps.sh"
if ! command -v nvidia-ctk >/dev/null; then
    # NVIDIA's apt repository (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html).
    apt-get install -y -qq curl gnupg >/dev/null
    curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey |
        gpg --dearmor --yes -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list |
        sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#' \
            >/etc/apt/sources.list.d/nvidia-container-toolkit.list
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nvidia-container-toolkit >/dev/null
fi
nvidia-ctk --version | head -1

bin=${WARREN_BIN:-}
if [ -z "$bin" ]; then
    echo "== building warren"
    (cd "$repo" && cargo build --release -p warren)
    bin=$repo/target/release/warren
fi

echo "== CDI spec (nvidia-ctk cdi generate, hooks removed)"
mkdir -p "$work/cdi"
nvidia-ctk cdi generate --format=json --output="$work/nvidia-generated.json"
python3 - "$work/nvidia-generated.json" "$work/cdi/nvidia.json" <<'EOF'
import json, sys
spec = json.load(open(sys.argv[1]))
dropped = len(spec.get("containerEdits", {}).pop("hooks", []))
for d in spec["devices"]:
    dropped += len(d.get("containerEdits", {}).pop("hooks", []))
json.dump(spec, open(sys.argv[2], "w"), indent=1)
print(f"{len(spec['devices'])} devices: {', '.join(d['name'] for d in spec['devices'])}; {dropped} hooks removed")
EOF
chmod 644 "$work/cdi/nvidia.json"
ls -l /dev/nvidia* || true
for n in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm; do
    [ -c "$n" ] || continue
    mode=$(stat -c %a "$n")
    [ "${mode: -1}" = 6 ] || [ "${mode: -1}" = 7 ] ||
        echo "warning: $n is mode $mode; a sandbox's root (an unprivileged host uid) needs o+rw (docs/gpu.md)"
done

echo "== warren doctor"
"$bin" doctor --cdi-dir "$work/cdi" | tee "$work/doctor.txt" | grep -iE "cdi|nvml" || true
grep -q "nvidia.com/gpu:" "$work/doctor.txt" && ok "doctor lists the GPUs" || bad "doctor lists no nvidia.com/gpu devices"
grep -qE "nvml +driver" "$work/doctor.txt" && ok "doctor loads NVML" || bad "doctor could not load NVML"

echo "== warren up (home $WARREN_HOME, $WARREN_URL)"
mkdir -p "$WARREN_HOME"
"$bin" up --home "$WARREN_HOME" --listen "127.0.0.1:$port" --cdi-dir "$work/cdi" >"$work/up.log" 2>&1 &
up=$!
cleanup() {
    kill -INT "$up" 2>/dev/null && wait "$up" 2>/dev/null || true
    echo "(work directory: $work; daemon log: $work/up.log)"
}
trap cleanup EXIT
for _ in $(seq 200); do curl -sf "$WARREN_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
"$bin" image pull "$image" >/dev/null

gpus=$(nvidia-smi -L | wc -l)
nodes=$("$bin" node ls --json 2>/dev/null || curl -sf -H "Authorization: Bearer $(cat "$WARREN_HOME/token")" "$WARREN_URL/v1/nodes")
echo "$nodes" | python3 -c 'import json,sys; n=json.load(sys.stdin)[0]; print("node capacity:", n["allocatable"].get("gpus"), "GPUs,", n["allocated"].get("gpus"), "allocated")'
[ "$(echo "$nodes" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["allocatable"].get("gpus"))')" = "$gpus" ] &&
    ok "the node lends $gpus GPU(s)" || bad "the node's capacity does not count $gpus GPU(s)"

echo "== a sandbox with one GPU: nvidia-smi"
gpu_box=$("$bin" create --image "$image" --gpus 1 --memory 2G)
"$bin" exec "$gpu_box" -- nvidia-smi | tee "$work/nvidia-smi.txt"
seen=$("$bin" exec "$gpu_box" -- nvidia-smi -L | grep -c "^GPU" || true)
[ "$seen" = 1 ] && ok "nvidia-smi in the sandbox sees exactly one GPU" || bad "nvidia-smi in the sandbox sees $seen GPUs"
"$bin" exec "$gpu_box" -- sh -c 'ls -l /dev/nvidia*'

echo "== GPU memory in Warren's usage"
# A CUDA context holding 256 MiB through the driver API (libcuda.so.1 is
# mounted by the CDI spec), held for 30 s.
cat >"$work/hold.py" <<'EOF'
import ctypes, time
cuda = ctypes.CDLL("libcuda.so.1")
def check(r, what):
    if r != 0:
        raise SystemExit(f"{what}: CUDA error {r}")
check(cuda.cuInit(0), "cuInit")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), 256 << 20), "cuMemAlloc")
print("holding 256 MiB of GPU memory", flush=True)
time.sleep(30)
EOF
"$bin" cp "$work/hold.py" "$gpu_box:/tmp/hold.py"
"$bin" exec "$gpu_box" -- python3 /tmp/hold.py &
holder=$!
used=0
for _ in $(seq 25); do
    sleep 1
    used=$("$bin" inspect "$gpu_box" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("usage", {}).get("gpu_memory_bytes", 0))')
    [ "$used" -gt 0 ] && break
done
echo "usage.gpu_memory_bytes = $used"
[ "$used" -ge $((256 << 20)) ] && ok "Warren's usage shows the sandbox's GPU memory ($used bytes)" ||
    bad "Warren's usage shows $used bytes of GPU memory, expected at least 256 MiB"
wait "$holder" || bad "the CUDA program failed"

echo "== a sandbox without GPUs"
plain=$("$bin" create --image "$image")
if "$bin" exec "$plain" -- sh -c 'ls /dev/nvidia* 2>/dev/null' | grep -q nvidia; then
    bad "a sandbox without GPUs sees /dev/nvidia*"
else
    ok "a sandbox without GPUs sees no /dev/nvidia*"
fi
"$bin" exec "$plain" -- sh -c 'command -v nvidia-smi' >/dev/null 2>&1 &&
    bad "a sandbox without GPUs has nvidia-smi" || ok "a sandbox without GPUs has no nvidia-smi"

echo "== the GPU is free again after its holder goes"
"$bin" rm "$gpu_box" "$plain" >/dev/null
if [ "$gpus" -gt 0 ]; then
    again=$("$bin" create --image "$image" --gpus "$gpus") && ok "all $gpus GPU(s) can be held again" || bad "the GPUs were not freed"
    [ -n "${again:-}" ] && "$bin" rm "$again" >/dev/null
fi

echo
[ "$failed" = 0 ] && echo "GPU check passed" || echo "GPU check FAILED"
exit "$failed"
