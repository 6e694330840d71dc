# Sourced by the benchmark scripts that need a registry: a free loopback
# port, waiting for an HTTP answer, and Debian's docker-registry on
# loopback (plain HTTP, filesystem storage under DIR).
#   port                      prints a free TCP port on 127.0.0.1
#   wait_http URL             waits up to 20 s for any HTTP answer
#   start_registry DIR LOG    starts one; sets reg_port, appends its pid to
#                             pids; LOG: "access" keeps the access log

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_http() {
    for _ in $(seq 400); do curl -sk -o /dev/null "$1" && return 0; sleep 0.05; done
    echo "no answer from $1" >&2
    exit 1
}

start_registry() {
    local dir=$1 access=disabled
    [ "${2:-}" = access ] && access=enabled
    reg_port=$(port)
    mkdir -p "$dir"
    cat >"$dir/registry.yml" <<YAML
version: 0.1
log: {level: error, accesslog: {disabled: $([ $access = enabled ] && echo false || echo true)}}
storage: {filesystem: {rootdirectory: $dir/data}}
http: {addr: 127.0.0.1:$reg_port}
YAML
    docker-registry serve "$dir/registry.yml" >"$dir/registry.log" 2>&1 &
    pids+=($!)
    wait_http "http://127.0.0.1:$reg_port/v2/"
}
