#!/usr/bin/env bash
# Warren's main job on the embedded default: `warren up` (control plane, node
# agent and SQLite in one process), a small image, and a demo batch of
# sandboxes. Run as root on Debian: installs what it needs, builds, starts.
#   scripts/demo.sh [BATCH_SIZE]
# WARREN_URL (default http://127.0.0.1:7070) and WARREN_HOME (default
# /var/lib/warren) pick its port and home. It runs WARREN_BIN, else the
# installed `warren`, else builds one from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-16}
[ "$(id -u)" = 0 ] || { echo "run as root: sandboxes need namespaces, cgroups and mounts" >&2; exit 1; }
bin=${WARREN_BIN:-$(command -v warren || true)}
if [ -z "$bin" ]; then
    scripts/install-deps.sh
    echo "== building warren (release; the first build takes about 10 minutes)"
    cargo build --release -p warren
    bin=$PWD/target/release/warren
fi
export WARREN_HOME=${WARREN_HOME:-/var/lib/warren}
export WARREN_URL=${WARREN_URL:-http://127.0.0.1:7070}
mkdir -p "$WARREN_HOME"
another_port="pick another port and home: WARREN_URL=http://127.0.0.1:7171 WARREN_HOME=/tmp/warren-demo scripts/demo.sh"
if curl -sf --max-time 2 "$WARREN_URL/healthz" >/dev/null 2>&1; then
    echo "a Warren already answers at $WARREN_URL: stop it first, or $another_port" >&2
    exit 1
fi
echo "== starting warren up (home $WARREN_HOME, $WARREN_URL)"
# Its own lines and warnings show here; its log is $WARREN_HOME/warren-up.log.
# setsid: Ctrl-C signals the terminal's whole process group, and the trap
# below signals warren up again; a second signal would stop it at once,
# leaving sandboxes behind for the next start instead of destroying them.
setsid "$bin" up --home "$WARREN_HOME" --listen "${WARREN_URL#http://}" &
pid=$!
# Ctrl-C, a TERM or any exit stops warren up, which destroys the batch and
# says "warren up: stopped": one stop function for all three.
stop() {
    trap - EXIT INT TERM
    kill -INT "$pid" 2>/dev/null || return 0
    wait "$pid" 2>/dev/null || true
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap stop EXIT
up=
for _ in $(seq 300); do
    if curl -sf --max-time 2 "$WARREN_URL/healthz" >/dev/null 2>&1; then up=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$up" ]; then
    echo "warren up did not start at $WARREN_URL (its words are above; is the port taken?): $another_port" >&2
    exit 1
fi
img=$(mktemp /tmp/warren-busybox.XXXXXX.tar)
scripts/make-busybox-image.sh "$img" >/dev/null
echo "== importing a busybox-static image"
"$bin" image import "$img" --name busybox:latest
rm -f "$img"
echo "== demo batch: $n sandboxes (cpu 0.25, memory 64M, pids 64), one task each"
start=$(date +%s%N)
ids=()
for i in $(seq "$n"); do
    id=$("$bin" create --image busybox:latest --cpu 0.25 --memory 64M --pids 64 \
        --label task=demo --label run=$$ --env TASK_INDEX="$i")
    ids+=("$id")
    printf '\r  created %d/%d' "$i" "$n"
done
echo
ready=$(( ($(date +%s%N) - start) / 1000000 ))
echo "  $n sandboxes ready in ${ready} ms"
tasks=()
for id in "${ids[@]}"; do
    "$bin" exec "$id" -- sh -c 'echo "task $TASK_INDEX on $(hostname): $(seq 1 200000 | tail -1) counted, OMP_NUM_THREADS=$OMP_NUM_THREADS, sees $(ps | wc -l) processes"' &
    tasks+=($!)
done
wait "${tasks[@]}"
echo "== isolation check in one sandbox"
"$bin" exec "${ids[0]}" -- sh -c 'mount -t tmpfs x /mnt 2>&1 || true; unshare -n true 2>&1 || true; ip -o link | cut -d: -f2'
echo "== tearing the batch down (warren rm --label run=$$)"
"$bin" rm --label run=$$ | wc -l | xargs echo "  destroyed:"
left=$(ls "$WARREN_HOME/sandboxes" 2>/dev/null | wc -l)
echo "  sandbox directories left on the host: $left"
# sed, not head: head closes the pipe early, `warren ps` then dies of
# SIGPIPE, and pipefail would end the demo (and its daemon) right here.
"$bin" ps --all --label run=$$ | sed -n 1,5p
echo
echo "warren up is running at $WARREN_URL (token: $WARREN_HOME/token). Try:"
env=
if [ "$WARREN_URL" != http://127.0.0.1:7070 ] || [ "$WARREN_HOME" != /var/lib/warren ]; then
    env="WARREN_URL=$WARREN_URL WARREN_HOME=$WARREN_HOME "
fi
echo "  $env$bin run --image busybox:latest --rm -- sh -c 'echo hello from a sandbox'"
echo "Press Ctrl-C to stop it."
wait $pid
