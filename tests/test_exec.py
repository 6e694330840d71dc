"""POST /v1/sandboxes/{id}/exec: exit codes, streams, stdin, env, timeouts, concurrency."""

import base64
import secrets
import threading
import time

import pytest

from helpers import error_body, sh_ok

# Runs again with the node over HTTP: exec, exec_input (docs/testing.md).
pytestmark = pytest.mark.contract

ALL_BYTES = bytes(range(256))


@pytest.fixture(scope="module")
def box(warren):
    """One sandbox shared by the read-only exec tests of this module."""
    info = warren.create()
    yield info["id"]
    warren.destroy(info["id"])


@pytest.mark.parametrize("cmd,code", [(["true"], 0), (["sh", "-c", "exit 3"], 3), (["false"], 1)])
def test_exit_codes(warren, box, cmd, code):
    ev, out, err, events = warren.exec(box, cmd)
    assert ev["code"] == code, (ev, err)
    assert ev["timed_out"] is False
    assert events[0]["type"] == "start" and isinstance(events[0]["pid"], int)
    assert events[-1] is ev  # exit is the last event


@pytest.mark.smoke  # exec
def test_unknown_program_is_127(warren, box):
    ev, out, err, _ = warren.exec(box, ["no-such-program-xyz", "arg"])
    assert ev["code"] == 127, ev
    assert b"no-such-program-xyz" in err


def test_killed_by_signal_is_128_plus_n(warren, box):
    ev, _, _, _ = warren.exec(box, ["sh", "-c", "kill -TERM $$"])
    assert ev["code"] == 128 + 15 and ev.get("signal") == 15, ev


def test_stdout_stderr_separated(warren, box):
    ev, out, err, events = warren.exec(box, ["sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2"])
    assert ev["code"] == 0
    assert out == b"out1\nout2\n"
    assert err == b"err1\nerr2\n"
    for e in events:
        if e["type"] in ("stdout", "stderr"):
            base64.b64decode(e["data"], validate=True)


def test_binary_output_all_byte_values(warren, box):
    r = warren.http.put(f"/v1/sandboxes/{box}/files", params={"path": "/tmp/allbytes.bin"}, content=ALL_BYTES * 3)
    assert r.status_code in (200, 201, 204), r.text
    ev, out, err, _ = warren.exec(box, ["sh", "-c", "cat /tmp/allbytes.bin; cat /tmp/allbytes.bin >&2"])
    assert ev["code"] == 0
    assert out == ALL_BYTES * 3
    assert err == ALL_BYTES * 3
    # printf with octal escapes produces every byte value too.
    fmt = "".join(f"\\{i:03o}" for i in range(256))
    ev, out, _, _ = warren.exec(box, ["printf", fmt])
    assert ev["code"] == 0 and out == ALL_BYTES


def test_large_output(warren, box):
    ev, out, _, _ = warren.exec(box, ["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x"])
    assert ev["code"] == 0
    assert len(out) == 5_000_000 and out == b"x" * 5_000_000


def test_stdin(warren, box):
    data = ALL_BYTES * 1000
    ev, out, _, _ = warren.exec(box, ["cat"], stdin=base64.b64encode(data).decode())
    assert ev["code"] == 0 and out == data
    ev, out, _, _ = warren.exec(box, ["wc", "-l"], stdin=base64.b64encode(b"a\nb\nc\n").decode())
    assert out.strip() == b"3"
    # Without stdin the command sees EOF at once.
    ev, out, _, _ = warren.exec(box, ["cat"], timeout="10s")
    assert ev["code"] == 0 and not ev["timed_out"] and out == b""


def test_env_and_cwd(warren, box):
    ev, out, err, _ = warren.exec(
        box, ["sh", "-c", 'echo "$FOO|$EMPTY|$(pwd)"'], env={"FOO": "bar baz", "EMPTY": ""}, cwd="/tmp"
    )
    assert ev["code"] == 0, err
    assert out == b"bar baz||/tmp\n"
    ev, out, _, _ = warren.exec(box, ["pwd"], cwd="/etc")
    assert out == b"/etc\n"


def test_timeout_kills_whole_tree(warren, sandbox):
    sid = sandbox()["id"]
    t0 = time.monotonic()
    ev, out, err, _ = warren.exec(sid, ["sh", "-c", "sleep 100 & sleep 100"], timeout="1s")
    elapsed = time.monotonic() - t0
    assert ev["timed_out"] is True, ev
    assert ev["code"] == 137, ev
    assert elapsed < 15, elapsed
    ps = sh_ok(warren, sid, "ps")
    assert "sleep" not in ps, ps


def test_timeout_kills_detached_processes_too(warren, sandbox):
    """A process that leaves the exec's process group (setsid) or detaches
    by double-forking is still part of the exec: its timeout kills it. A
    background job of an exec that ended normally keeps running."""
    sid = sandbox()["id"]
    script = ("setsid sleep 1001 & (setsid sleep 1002 &); (sleep 1003 &); "
              "setsid sh -c 'while :; do sleep 1004 & wait; done' & sleep 1005")
    ev, _, _, _ = warren.exec(sid, ["sh", "-c", script], timeout="1s")
    assert ev["timed_out"] is True and ev["code"] == 137, ev
    ps = sh_ok(warren, sid, "ps -o pid,args")
    assert not any(f"sleep {n}" in ps for n in range(1001, 1006)), ps
    sh_ok(warren, sid, "setsid sleep 1006 >/dev/null 2>&1 &")
    time.sleep(0.3)
    assert "sleep 1006" in sh_ok(warren, sid, "ps -o args")


def test_concurrent_execs(warren, box):
    n = 16
    bar = f"/tmp/barrier-{secrets.token_hex(4)}"
    results = [None] * n

    # Each command waits (up to 30 s) until all 16 have started: this only
    # finishes with count=16 everywhere if the execs really run side by side.
    script = (
        f'mkdir -p {bar}; touch {bar}/$X; echo start-$X; n=0; '
        f'while [ $(ls {bar} | wc -l) -lt {n} ] && [ $n -lt 600 ]; do sleep 0.05; n=$((n+1)); done; '
        f'echo "count=$(ls {bar} | wc -l)"; echo "end-$X" >&2; exit $X'
    )

    def worker(i):
        with warren.client() as c:
            results[i] = warren.exec(box, ["sh", "-c", script], client=c, env={"X": str(i)})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    pids = set()
    for i, res in enumerate(results):
        assert res is not None, f"exec {i} did not finish"
        ev, out, err, events = res
        assert isinstance(ev, dict), ev
        assert ev["code"] == i
        assert out == f"start-{i}\ncount={n}\n".encode()
        assert err == f"end-{i}\n".encode()
        pids.add(events[0]["pid"])
    assert len(pids) == n


def test_exec_as_user(warren, box):
    ev, out, err, _ = warren.exec(
        box,
        ["sh", "-c", "id -u; id -g; grep CapEff /proc/self/status | tr -d '\t '; touch /root/x 2>/dev/null || echo denied"],
        user="1000",
    )
    assert ev["code"] == 0, err
    lines = out.decode().split()
    assert lines == ["1000", "1000", "CapEff:0000000000000000", "denied"], out
    ev, out, _, _ = warren.exec(box, ["id", "-u"])
    assert out == b"0\n"


def test_exec_into_destroyed_sandbox_is_409(warren):
    sid = warren.create()["id"]
    assert warren.destroy(sid).status_code == 200
    r, _, _, _ = warren.exec(sid, ["true"])
    assert r.status_code == 409, r.text
    assert "destroyed" in error_body(r)["message"]


def test_exec_into_unknown_sandbox_is_404(warren):
    r, _, _, _ = warren.exec("sbx-000000000000", ["true"])
    assert r.status_code == 404
    error_body(r)


def test_exec_gets_default_signal_dispositions(warren, sandbox):
    """No signal is ignored in an exec (SIGPIPE especially: `yes | head` must end)."""
    sid = sandbox()["id"]
    ex, out, err, _ = warren.exec(sid, ["sh", "-c", "grep SigIgn /proc/self/status; yes | head -n 2"], timeout="10s")
    assert ex["code"] == 0 and not ex["timed_out"], (out, err)
    lines = out.decode().split()
    assert lines[:2] == ["SigIgn:", "0000000000000000"], out
    assert lines[2:] == ["y", "y"]


def test_a_dropped_exec_stream_kills_its_command_at_once(warren, sandbox):
    """A client that goes away (closes the stream) takes its command with
    it, whole tree, even when the command is silent."""
    sid = sandbox()["id"]
    with warren.http.stream("POST", f"/v1/sandboxes/{sid}/exec",
                            json={"cmd": ["sh", "-c", "sleep 1007 & sleep 1008"]}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            assert '"start"' in line, line
            break
    deadline = time.monotonic() + 3
    while "sleep 100" in (ps := sh_ok(warren, sid, "ps -o args")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "sleep 1007" not in ps and "sleep 1008" not in ps, ps


def test_stdin_open_takes_input_while_the_command_runs(warren, box):
    import json

    with warren.http.stream("POST", f"/v1/sandboxes/{box}/exec",
                            json={"cmd": ["cat"], "stdin": base64.b64encode(b"one ").decode(),
                                  "stdin_open": True, "timeout": "30s"}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        start = json.loads(next(lines))
        assert start["type"] == "start", start
        url = f"/v1/sandboxes/{box}/execs/{start['exec_id']}/stdin"
        assert warren.http.post(url, content=b"two ").status_code == 204
        assert warren.http.post(url, content=b"three\n", params={"close": "true"}).status_code == 204
        out, exit_ev = b"", None
        for line in lines:
            ev = json.loads(line)
            if ev["type"] == "stdout":
                out += base64.b64decode(ev["data"])
            elif ev["type"] == "exit":
                exit_ev = ev
        assert exit_ev and exit_ev["code"] == 0 and not exit_ev["timed_out"], exit_ev
        assert out == b"one two three\n", out
    # Its stdin went with it; so does an exec that never took input.
    r = warren.http.post(url, content=b"late")
    assert r.status_code == 404 and "stdin_open" in error_body(r)["message"], r.text
    ev, _, _, _ = warren.exec(box, ["true"])
    assert ev["code"] == 0


def test_a_missing_working_directory_is_named_as_such(warren, sandbox):
    """Issue 42 (1): `cwd` that does not exist is reported as the working
    directory, not as a program that cannot run."""
    sid = sandbox()["id"]
    ev, out, err, _ = warren.exec(sid, ["sh", "-c", "true"], cwd="/no/such/dir")
    assert ev["code"] == 126 and err == b"working directory /no/such/dir does not exist\n", (ev, err)
    sh_ok(warren, sid, "touch /tmp/file")
    ev, out, err, _ = warren.exec(sid, ["true"], cwd="/tmp/file")
    assert err == b"working directory /tmp/file is not a directory\n", err
    # A missing program still says so.
    ev, out, err, _ = warren.exec(sid, ["no-such-program"])
    assert ev["code"] == 127 and b"cannot run" in err, (ev, err)
