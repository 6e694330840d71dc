# Sourced by the benchmark scripts: builds the release binaries, starts a
# `warren up` of the benchmark's own on PORT with busybox:latest imported,
# and removes everything on exit. Sets: bin (warren), bench (warren-bench),
# work, home, pid, WARREN_URL, WARREN_HOME.   Usage: start_bench_daemon PORT [EXTRA UP FLAGS...]
start_bench_daemon() {
    local port=$1
    shift
    scripts/install-deps.sh --test
    cargo build --release -p warren -p warren-bench
    bin=$PWD/target/release/warren
    bench=$PWD/target/release/warren-bench
    work=$(mktemp -d /tmp/warren-bench.XXXXXX)
    home=$work/home
    trap 'stop_bench_daemon' EXIT
    scripts/make-busybox-image.sh "$work/busybox.tar" >/dev/null
    # Default flags: sandboxes of default sizes reserve 10m and 16M, so the
    # hundreds alive at once fit (each is still capped by its own limits).
    "$bin" up --home "$home" --listen 127.0.0.1:"$port" "$@" 2>"$work/up.log" &
    pid=$!
    export WARREN_URL=http://127.0.0.1:$port WARREN_HOME=$home
    for _ in $(seq 100); do curl -sf "$WARREN_URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
    "$bin" image import "$work/busybox.tar" --name busybox:latest >/dev/null
}

stop_bench_daemon() {
    # Sandboxes outlive their daemon by design; an interrupted benchmark must
    # not leave its sandboxes running once their home is gone.
    if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then
        "$bin" ps --json 2>/dev/null | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' \
            | xargs -r "$bin" rm >/dev/null 2>&1 || true
    fi
    [ -n "${pid:-}" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    rm -rf "$work"
}
