# A `warren up` serving both E2B doors on loopback, for the scripts that run
# E2B's own SDK test suites (scripts/e2b-suite.sh, scripts/e2b-js-suite.sh).
# Source it, then:
#
#   e2b_base_image              # prints the path of E2B's `base` made offline
#                               # (built once, cached under the test cache)
#   start_e2b_warren WORK NAME  # a daemon with its home in WORK/home and its
#                               # log in WORK/warren.log, cgroup parent
#                               # warren/NAME-$$, the template `base` imported;
#                               # sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY
#                               # and $e2b_daemon (stop it with stop_e2b_warren)
#
# Needs $here (the checkout), $warren (the binary) and $cache (the test cache).
# WARREN_UP_ARGS, if set, is split on whitespace and added to the `warren up`
# line (e.g. WARREN_UP_ARGS="--default-isolation gvisor": every sandbox the
# suite makes runs on gVisor); unset, the daemon is started as before.

e2b_base_image() {
    local image="$cache/debian-bookworm-python3-e2b-oci.tar"
    if [ ! -f "$image" ]; then
        echo "== E2B's base, offline" >&2
        "$here/scripts/make-base-image.sh" "$image" --include python3 --tag deb --e2b-user >&2
    fi
    echo "$image"
}

start_e2b_warren() {
    local work=$1 name=$2 image api e2b_api e2b_sbx extra=()
    read -r -a extra <<< "${WARREN_UP_ARGS:-}"
    image=$(e2b_base_image)
    local port='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    api=$(python3 -c "$port") e2b_api=$(python3 -c "$port") e2b_sbx=$(python3 -c "$port")
    mkdir -m 0700 "$work/home"
    printf '[templates]\nbase = "e2b-base:1"\n' > "$work/home/e2b-templates.toml"
    printf 'unqualified-search-registries = []\n' > "$work/home/registries.toml"
    "$warren" up --home "$work/home" --listen "127.0.0.1:$api" --cgroup-parent "warren/$name-$$" \
        --e2b-api "127.0.0.1:$e2b_api" --e2b-sandbox "127.0.0.1:$e2b_sbx" ${extra[@]+"${extra[@]}"} \
        > "$work/warren.log" 2>&1 &
    e2b_daemon=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$api/healthz" | grep -q ok && break
        sleep 0.1
    done
    WARREN_URL="http://127.0.0.1:$api" "$warren" --home "$work/home" image import "$image" --name e2b-base:1 >/dev/null
    export E2B_API_URL="http://127.0.0.1:$e2b_api" E2B_SANDBOX_URL="http://127.0.0.1:$e2b_sbx"
    E2B_API_KEY="e2b_$(cat "$work/home/token")"
    export E2B_API_KEY
}

stop_e2b_warren() {
    [ -n "${e2b_daemon:-}" ] || return 0
    kill -INT "$e2b_daemon" 2>/dev/null && wait "$e2b_daemon" 2>/dev/null || true
}
