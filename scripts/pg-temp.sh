#!/usr/bin/env bash
# A throw-away PostgreSQL server for tests (Debian's `postgresql` package).
#
#   url=$(scripts/pg-temp.sh start DIR [--tcp])   # prints the server's URL
#   ...                                           # use it: superuser `postgres`, database `postgres`
#   scripts/pg-temp.sh stop DIR                   # stops it and removes DIR
#
# DIR must not exist yet, or be empty; its parent must be searchable by the
# user `postgres` when run as root (a directory of its own under /tmp is:
# `mktemp -d` gives one; pytest's tmp_path is not). The server keeps
# everything in DIR: data in DIR/data, its log in DIR/postgres.log, and
# listens only on a unix socket in DIR (no port to collide with another
# test's), or with --tcp on 127.0.0.1 at a free port as well, or at
# PG_TEMP_PORT when that is set (the URL printed is then the TCP one). Authentication is `trust`: the socket is reachable
# only by DIR's owner and root; a --tcp server by every local user.
#
# Run as root (as the tests are), the server runs as `postgres` (initdb
# refuses root); run as anyone else, as that user. Extra server settings go
# in PG_TEMP_OPTS (e.g. PG_TEMP_OPTS="-c fsync=off -c max_connections=500").
#
# `stop` always removes DIR, also when the server is already gone or never
# came up: call it from a trap or a finally. Start failures print the
# server's log. Users: scripts/test.sh (trap), tests/pg.py (a pytest
# fixture), and through WARREN_TEST_DATABASE_URL the Rust store tests.
set -euo pipefail

usage() { echo "usage: $0 start DIR [--tcp] | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 dir=$2 tcp=
case "${3:-}" in --tcp) tcp=1 ;; "") ;; *) usage ;; esac

bindir() {
    # The newest installed server's programs (pg_ctl is not on PATH).
    local b
    b=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$b" ] && [ -x "$b/initdb" ] || {
        echo "pg-temp: no PostgreSQL server found under /usr/lib/postgresql (apt-get install postgresql)" >&2
        exit 1
    }
    echo "$b"
}

# Runs a server program as the user the server belongs to.
as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
    bin=$(bindir)
    if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
        echo "pg-temp: $dir is not empty" >&2; exit 1
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # A unix socket's path is at most 107 bytes: DIR/.s.PGSQL.5432.
    [ ${#dir} -le 90 ] || { echo "pg-temp: $dir is too long for a socket path (90 bytes at most)" >&2; exit 1; }
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
        runuser -u postgres -- test -w "$dir" || {
            echo "pg-temp: user postgres cannot reach $dir (every parent must be searchable by it)" >&2
            exit 1
        }
    fi
    chmod 700 "$dir"
    # The C locale sorts text by bytes (as SQLite does) and needs no
    # locale installed. --no-sync: a throw-away cluster need not survive
    # a power cut, and syncing it costs seconds.
    if ! as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 \
        --locale=C --no-sync >"$dir/initdb.log" 2>&1; then
        cat "$dir/initdb.log" >&2; exit 1
    fi
    port=5432 listen=""
    if [ -n "$tcp" ]; then
        # PG_TEMP_PORT: the caller's choice (the tests take theirs from
        # blocks below the ephemeral range: tests/ports.py).
        port=${PG_TEMP_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
        listen=127.0.0.1
    fi
    # -w: returns once the server accepts connections (or has failed).
    if ! as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
        -o "-c listen_addresses='$listen' -c unix_socket_directories='$dir' -p $port ${PG_TEMP_OPTS:-}" \
        start >/dev/null; then
        echo "pg-temp: the server did not start; its log:" >&2
        cat "$dir/postgres.log" >&2 || true
        exit 1
    fi
    if [ -n "$tcp" ]; then
        echo "postgres://postgres@127.0.0.1:$port/postgres"
    else
        # The socket's directory as the host, percent-encoded (libpq and
        # sqlx both read it so).
        host=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$dir")
        echo "postgres://postgres@$host:$port/postgres"
    fi
    ;;
stop)
    [ -d "$dir" ] || exit 0
    if [ -f "$dir/data/postmaster.pid" ]; then
        bin=$(bindir)
        # Fast (sessions cut, a checkpoint of next to nothing) is quicker
        # than immediate for a server just started, which waits on
        # children still starting; immediate if fast does not do.
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 10 stop >/dev/null 2>&1 ||
            as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
        # Still there (pg_ctl failed or timed out): the postmaster goes by
        # force, its backends follow it. Only if that pid is still this
        # server's: a dead server's pid may belong to anything by now.
        if [ -f "$dir/data/postmaster.pid" ]; then
            pid=$(head -n 1 "$dir/data/postmaster.pid")
            if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-D $dir/data"; then
                kill -KILL "$pid" 2>/dev/null || true
            fi
        fi
    fi
    rm -rf "$dir"
    ;;
*) usage ;;
esac
