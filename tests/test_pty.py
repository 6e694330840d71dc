"""Execs on a terminal (`tty: true`): a pseudo-terminal of the sandbox's own
devpts, its size and resizes, typed input, exit codes, timeouts; `warren
exec -it` under a real pseudo-terminal; the exec WebSocket."""

import base64
import fcntl
import json
import os
import pty
import queue
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time

import pytest

from conftest import WARREN
from helpers import WebSocket, error_body, sh_ok, wait_until

# Runs again with the node over HTTP: exec_resize and terminal input (docs/testing.md).
pytestmark = pytest.mark.contract


@pytest.fixture(scope="module", params=["container", "gvisor"])
def box(warren, request):
    # In gVisor no descriptor leaves the sandbox: init keeps the terminal's
    # master and relays it (warren-init's relay.rs), and sends SIGWINCH on a
    # resize. What Debian's runsc (0.0~20221219) does not do inside its own
    # kernel (/dev/tty, ^C and ^D in the line discipline) is asserted as
    # such, so a runsc that does them fails here and docs/isolation.md gets
    # updated.
    info = warren.create(isolation=request.param)
    yield info["id"]
    warren.destroy(info["id"])


def gvisor(warren, box):
    return warren.http.get(f"/v1/sandboxes/{box}").json()["spec"]["isolation"] == "gvisor"


class Session:
    """A running exec's NDJSON stream, read by a thread: output collects in
    `out`; `expect` waits for a pattern in what came after the last one."""

    def __init__(self, warren, sid, body):
        self.warren, self.sid = warren, sid
        self.client = warren.client()
        self.events = queue.Queue()
        self.out = b""
        self.seen = 0
        self.exit = None
        self.stderr = b""
        self.lock = threading.Condition()
        started = threading.Event()
        self.status = None

        def read():
            with self.client.stream("POST", f"/v1/sandboxes/{sid}/exec", json=body) as r:
                self.status = r.status_code
                if r.status_code != 200:
                    self.error = r.read()
                    started.set()
                    return
                for line in r.iter_lines():
                    if not line:
                        continue
                    ev = json.loads(line)
                    with self.lock:
                        if ev["type"] == "start":
                            self.exec_id = ev["exec_id"]
                            started.set()
                        elif ev["type"] == "stdout":
                            self.out += base64.b64decode(ev["data"])
                        elif ev["type"] == "stderr":
                            self.stderr += base64.b64decode(ev["data"])
                        elif ev["type"] == "exit":
                            self.exit = ev
                        self.lock.notify_all()
            with self.lock:
                self.done = True
                self.lock.notify_all()

        self.done = False
        self.thread = threading.Thread(target=read, daemon=True)
        self.thread.start()
        assert started.wait(20), "the exec did not start"
        assert self.status == 200, self.error

    def expect(self, pattern, timeout=10):
        """Waits until `pattern` (a regex over bytes) shows up in the output
        after what earlier expects consumed; returns the match."""
        rx = re.compile(pattern)
        with self.lock:
            deadline = time.time() + timeout
            while True:
                m = rx.search(self.out, self.seen)
                if m:
                    self.seen = m.end()
                    return m
                left = deadline - time.time()
                if left <= 0 or self.done:
                    raise AssertionError(f"{pattern!r} not in the output: {self.out[self.seen:]!r}")
                self.lock.wait(left)

    def type(self, data, close=False):
        r = self.warren.http.post(f"/v1/sandboxes/{self.sid}/execs/{self.exec_id}/stdin",
                                  content=data, params={"close": "true"} if close else None)
        assert r.status_code == 204, r.text

    def resize(self, rows, cols):
        return self.warren.http.post(f"/v1/sandboxes/{self.sid}/execs/{self.exec_id}/resize",
                                     json={"rows": rows, "cols": cols})

    def wait_exit(self, timeout=20):
        self.thread.join(timeout)
        assert self.exit is not None, f"no exit event; output {self.out!r}"
        return self.exit


def test_a_tty_exec_runs_on_a_terminal_of_the_requested_size(warren, box):
    script = ("tty; stty size; echo TERM=$TERM; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-ttys; "
              "echo to-ctty > /dev/tty; echo err >&2; exit 4")
    ev, out, err, events = warren.exec(box, ["sh", "-c", script], tty=True, rows=33, cols=111)
    assert ev["code"] == 4, (ev, out)
    text = out.decode()
    # The sandbox's own devpts: its first terminal is /dev/pts/0 there.
    assert re.search(r"^/dev/pts/\d+\r$", text, re.M), text
    assert "33 111\r\n" in text and "TERM=xterm-256color\r\n" in text, text
    if gvisor(warren, box):
        # This runsc has no /dev/tty (opening it gives EIO).
        assert "all-ttys\r\n" in text and "/dev/tty: Input/output error" in text, text
    else:
        assert "all-ttys\r\n" in text and "to-ctty\r\n" in text, text
    # stderr is the terminal too: everything arrives as stdout.
    assert "err\r\n" in text and err == b"", (text, err)
    assert not any(e["type"] == "stderr" for e in events)
    # Without a size the terminal is 24x80; TERM set by the request stays.
    ev, out, _, _ = warren.exec(box, ["sh", "-c", "stty size; echo $TERM"], tty=True, env={"TERM": "dumb"})
    assert ev["code"] == 0 and out == b"24 80\r\ndumb\r\n", out
    # Without tty there is no terminal at all.
    ev, out, _, _ = warren.exec(box, ["sh", "-c", "tty; [ -t 1 ] || echo no-tty"])
    assert b"not a tty" in out and b"no-tty" in out, out


@pytest.mark.serial  # lists the host's /dev/pts before and after
def test_the_terminal_is_the_sandboxes_not_the_hosts(warren, box):
    host_before = set(os.listdir("/dev/pts"))
    s = Session(warren, box, {"cmd": ["sh", "-c", "tty; ls /dev/pts; read x"], "tty": True, "stdin_open": True})
    m = s.expect(rb"/dev/pts/(\d+)\r\n")
    listing = s.expect(rb"ptmx\r\n")
    assert m.group(1) in s.out[m.end():listing.end()], s.out
    # The host's /dev/pts got no new terminal for it.
    assert set(os.listdir("/dev/pts")) - host_before == set()
    s.type(b"\n")
    assert s.wait_exit()["code"] == 0


def test_typed_input_echoes_resizes_reach_the_shell_and_exit_code_comes_back(warren, box):
    s = Session(warren, box, {"cmd": ["sh"], "tty": True, "stdin_open": True, "rows": 20, "cols": 60,
                              "timeout": "60s"})
    s.type(b"stty size\n")
    s.expect(rb"20 60\r\n")
    # The foreground job gets SIGWINCH and sees the new size.
    s.type(b"sh -c 'trap \"echo got-WINCH; stty size; exit\" WINCH; echo armed; while :; do sleep 0.1; done'\n")
    s.expect(rb"armed\r\n")
    assert s.resize(50, 132).status_code == 204
    s.expect(rb"got-WINCH\r\n50 132\r\n")
    # What is typed is echoed by the terminal, then run by the shell.
    s.type(b"echo typed-$((6*7))\n")
    s.expect(rb"echo typed-\$\(\(6\*7\)\)")
    s.expect(rb"typed-42\r\n")
    # ^C reaches the foreground job through the terminal, not the shell.
    if gvisor(warren, box):
        # This runsc's line discipline sends no signal for ^C: the job
        # runs to its end.
        s.type(b"sleep 1; echo after-$((1+1))\n")
        time.sleep(0.3)
        s.type(b"\x03")
        s.expect(rb"after-2\r\n")
    else:
        s.type(b"sleep 30; echo after-$((1+1))\n")
        time.sleep(0.5)
        s.type(b"\x03")
        s.type(b"echo alive\n")
        s.expect(rb"alive\r\n")
        assert b"after-2" not in s.out
    s.type(b"exit 7\n")
    ev = s.wait_exit()
    assert ev["code"] == 7 and not ev["timed_out"], ev


def test_closing_a_terminals_stdin_is_end_of_input(warren, box):
    timeout = "3s" if gvisor(warren, box) else "30s"
    s = Session(warren, box, {"cmd": ["cat"], "tty": True, "stdin_open": True, "timeout": timeout})
    s.type(b"abc\n")
    s.expect(rb"abc\r\nabc\r\n")  # the echo, then cat's copy
    s.type(b"", close=True)
    ev = s.wait_exit()
    if gvisor(warren, box):
        # The end of input is a ^D, which this runsc's line discipline does
        # not turn into end of file: cat reads on until its timeout.
        assert ev["timed_out"], (ev, s.out)
    else:
        assert ev["code"] == 0, (ev, s.out)


def test_resize_errors_are_clear(warren, box):
    # A running exec without a terminal.
    plain = Session(warren, box, {"cmd": ["sh", "-c", "read x"], "stdin_open": True, "timeout": "30s"})
    r = plain.resize(10, 10)
    assert r.status_code == 409 and "tty" in error_body(r)["message"], r.text
    plain.type(b"\n", close=True)
    assert plain.wait_exit()["code"] == 0
    # One that has ended, and one that never was.
    r = plain.resize(10, 10)
    assert r.status_code == 404 and error_body(r)["code"] == "not_found", r.text
    r = warren.http.post(f"/v1/sandboxes/{box}/execs/ex-nope/resize", json={"rows": 5, "cols": 5})
    assert r.status_code == 404, r.text
    # Sizes: zero, missing, extra fields.
    s = Session(warren, box, {"cmd": ["sh", "-c", "read x"], "tty": True, "stdin_open": True, "timeout": "30s"})
    for body in ({"rows": 0, "cols": 80}, {"rows": 24}, {"rows": 24, "cols": 80, "x": 1}, {"rows": -1, "cols": 5}):
        r = warren.http.post(f"/v1/sandboxes/{box}/execs/{s.exec_id}/resize", json=body)
        assert r.status_code == 400, (body, r.text)
        error_body(r)
    s.type(b"\n")
    assert s.wait_exit()["code"] == 0
    # An unknown sandbox.
    r = warren.http.post("/v1/sandboxes/sbx-nope/execs/ex-1/resize", json={"rows": 5, "cols": 5})
    assert r.status_code == 404, r.text
    # Sizes without a terminal, and a zero size, in the exec request.
    for body in ({"cmd": ["true"], "rows": 10}, {"cmd": ["true"], "tty": True, "cols": 0}):
        r = warren.http.post(f"/v1/sandboxes/{box}/exec", json=body)
        assert r.status_code == 400, (body, r.text)
        assert "tty" in error_body(r)["message"] or "row" in error_body(r)["message"], r.text


def test_a_tty_execs_timeout_kills_its_whole_tree(warren, box):
    tag = f"{os.getpid() % 1000 + 1000}"
    ev, out, _, _ = warren.exec(box, ["sh", "-c", f"sleep {tag}1 & setsid sleep {tag}2 & sleep {tag}3"],
                                tty=True, timeout="1s")
    assert ev["code"] == 137 and ev["timed_out"], ev
    ps = sh_ok(warren, box, "ps -o args")
    assert f"sleep {tag}" not in ps, ps


def read_until(fd, pattern, timeout=10):
    """Reads a pty master until `pattern` (regex over bytes) appears."""
    rx = re.compile(pattern)
    buf, deadline = b"", time.time() + timeout
    while not rx.search(buf):
        left = deadline - time.time()
        if left <= 0:
            raise AssertionError(f"{pattern!r} not in {buf!r}")
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                raise AssertionError(f"{pattern!r} not in {buf!r} (the terminal closed)")
            if not chunk:
                raise AssertionError(f"{pattern!r} not in {buf!r} (the terminal closed)")
            buf += chunk
    return buf


def set_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def spawn_cli(warren, args, rows=30, cols=90):
    """`warren ARGS` on a new pseudo-terminal (its controlling terminal):
    returns (process, master fd, slave fd); the slave stays open here to
    read the terminal's settings."""
    master, slave = os.openpty()
    set_size(slave, rows, cols)

    def ctty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([str(WARREN), *args], stdin=slave, stdout=slave, stderr=slave,
                            env=warren.env(), preexec_fn=ctty, close_fds=True)
    return proc, master, slave


def raw(slave):
    return not (termios.tcgetattr(slave)[3] & termios.ICANON)


def test_cli_exec_it_is_a_terminal_session(warren, box):
    proc, master, slave = spawn_cli(warren, ["exec", "-it", box, "--", "sh"])
    before = None
    try:
        read_until(master, rb"# ")
        assert raw(slave), "the local terminal is not in raw mode during the session"
        os.write(master, b"stty size; tty\n")
        read_until(master, rb"30 90\r\n/dev/pts/\d+\r\n")
        # A resize of the local terminal follows to the sandbox's.
        set_size(slave, 50, 132)
        proc.send_signal(signal.SIGWINCH)
        time.sleep(0.3)
        os.write(master, b"stty size\n")
        read_until(master, rb"50 132\r\n")
        # ^C goes to the command's terminal, not to the CLI (in gVisor,
        # whose line discipline here sends no signal, the job then ends
        # by itself: see the box fixture).
        in_gvisor = gvisor(warren, box)
        os.write(master, b"sleep 1; echo after-$((2+2))\n" if in_gvisor else b"sleep 30; echo after-$((2+2))\n")
        time.sleep(0.5)
        os.write(master, b"\x03")
        os.write(master, b"echo hi; exit 3\n")
        out = read_until(master, rb"hi\r\n")
        assert (b"after-4" in out) == in_gvisor, out
        assert proc.wait(20) == 3
        # Restored: canonical mode and echo are back.
        attrs = termios.tcgetattr(slave)
        assert attrs[3] & termios.ICANON and attrs[3] & termios.ECHO, attrs
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(slave)


def test_cli_exec_it_restores_the_terminal_when_killed(warren, box):
    proc, master, slave = spawn_cli(warren, ["exec", "-it", box, "--", "sh", "-c", "echo ready; sleep 60"])
    try:
        before_cooked = termios.tcgetattr(slave)
        read_until(master, rb"ready")
        wait_until(lambda: raw(slave), what="raw mode")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM
        assert termios.tcgetattr(slave)[3] == before_cooked[3]
        # The session's command went with it.
        wait_until(lambda: "sleep 60" not in sh_ok(warren, box, "ps -o args"), what="the sleep to be killed")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(slave)


def test_cli_exec_it_on_an_unknown_sandbox_fails_cleanly(warren):
    proc, master, slave = spawn_cli(warren, ["exec", "-it", "sbx-nope", "--", "sh"])
    try:
        out = read_until(master, rb"sbx-nope")
        assert proc.wait(20) == 1, out
        assert not raw(slave)
    finally:
        os.close(master)
        os.close(slave)


def test_cli_tty_needs_a_terminal(warren, box):
    p = warren.cli("exec", "-t", box, "--", "true", input=b"", check=False)
    assert p.returncode == 1
    assert b"the input device is not a TTY" in p.stderr, p.stderr


def ws_open(warren, sid, token=True):
    return WebSocket(warren.url, f"/v1/sandboxes/{sid}/exec/ws", token=warren.token if token else None)


def ws_output_until(ws, pattern, timeout=10):
    rx = re.compile(pattern)
    buf = b""
    ws.sock.settimeout(timeout)
    while not rx.search(buf):
        kind, payload = ws.recv()
        if kind == "binary":
            buf += payload
        elif kind == "close":
            raise AssertionError(f"closed {payload} before {pattern!r}: {buf!r}")
    return buf


def test_websocket_session(warren, box):
    ws = ws_open(warren, box)
    assert ws.status == 101, (ws.status, ws.body)
    ws.send_json({"cmd": ["sh"], "tty": True, "rows": 20, "cols": 70})
    kind, start = ws.recv()
    assert kind == "text" and json.loads(start)["type"] == "start", start
    ws.send(b"stty size\n")
    ws_output_until(ws, rb"20 70\r\n")
    ws.send_json({"resize": {"rows": 40, "cols": 100}})
    ws.send(b"stty size\n")
    ws_output_until(ws, rb"40 100\r\n")
    ws.send(b"echo $((1+2))-ws; exit 5\n")
    ws_output_until(ws, rb"3-ws\r\n")
    while True:
        kind, payload = ws.recv()
        if kind == "text":
            ev = json.loads(payload)
            assert ev["type"] == "exit" and ev["code"] == 5, ev
            break
        assert kind == "binary", (kind, payload)
    assert ws.recv() == ("close", (1000, ""))
    ws.sock.close()


def test_websocket_errors(warren, box):
    # No token: refused before the upgrade, as the rest of the API.
    ws = ws_open(warren, box, token=False)
    assert ws.status == 401, ws.status
    ws.sock.close()
    # An unknown sandbox: a 404 in HTTP, with Warren's error body.
    ws = WebSocket(warren.url, "/v1/sandboxes/sbx-nope/exec/ws", token=warren.token)
    assert ws.status == 404 and json.loads(ws.body)["error"]["code"] == "not_found", ws.body
    ws.sock.close()
    # Not a WebSocket request.
    r = warren.http.get(f"/v1/sandboxes/{box}/exec/ws")
    assert r.status_code == 400 and "WebSocket" in error_body(r)["message"], r.text
    # A first message that is not an exec request: the error body, then a
    # close whose code carries the status.
    ws = ws_open(warren, box)
    ws.send_json({"command": "sh"})
    kind, body = ws.recv()
    assert kind == "text" and json.loads(body)["error"]["code"] == "bad_request", body
    assert ws.recv()[1][0] == 4400
    ws.sock.close()
    ws = ws_open(warren, box)
    ws.send_json({"cmd": ["true"], "tty": True, "rows": 0})
    kind, body = ws.recv()
    assert "row" in json.loads(body)["error"]["message"], body
    assert ws.recv()[1][0] == 4400
    ws.sock.close()
    # A text message that is not a control message ends the session.
    ws = ws_open(warren, box)
    ws.send_json({"cmd": ["sh"], "tty": True})
    assert json.loads(ws.recv()[1])["type"] == "start"
    ws.send_json({"resize": {"rows": 0, "cols": 5}})
    while True:
        kind, payload = ws.recv()
        if kind == "close":
            assert payload[0] == 4400, payload
            break
        if kind == "text":
            assert json.loads(payload)["error"]["code"] == "bad_request", payload
    ws.sock.close()


def test_closing_the_websocket_kills_the_exec(warren, box):
    ws = ws_open(warren, box)
    ws.send_json({"cmd": ["sh", "-c", "echo up; sleep 4242"], "tty": True})
    assert json.loads(ws.recv()[1])["type"] == "start"
    ws_output_until(ws, rb"up")
    ws.close()
    wait_until(lambda: "sleep 4242" not in sh_ok(warren, box, "ps -o args"), what="the exec to be killed")


def test_sdk_exec_stream_on_a_terminal(warren, box):
    import asyncio

    import warren as sdk
    from warren import models

    with sdk.Client(warren.url, token=warren.token) as c:
        sb = c.sandboxes.get(box)
        with sb.exec_stream(["sh"], tty=True, rows=22, cols=77, stdin_open=True, timeout=30) as s:
            out = b""

            def until(pattern):
                nonlocal out
                for ev in s:
                    if isinstance(ev, models.ExecOutput):
                        assert ev.stream == "stdout", ev
                        out += ev.data
                        if re.search(pattern, out):
                            return
                raise AssertionError(f"{pattern!r} not in {out!r}")

            until(rb"# ")
            s.send_stdin("stty size\n")
            until(rb"22 77\r\n")
            s.resize(44, 99)
            s.send_stdin("stty size; exit 6\n")
            until(rb"44 99\r\n")
            for _ in s:
                pass
            assert s.result.exit_code == 6

    async def main():
        async with sdk.AsyncClient(warren.url, token=warren.token) as c:
            sb = await c.sandboxes.get(box)
            async with await sb.exec_stream("stty size; read x; stty size", tty=True, stdin_open=True) as s:
                seen = b""
                async for ev in s:
                    if isinstance(ev, models.ExecOutput):
                        seen += ev.data
                        if seen.endswith(b"24 80\r\n"):
                            await s.resize(10, 20)
                            await s.send_stdin("\n")
                assert seen.endswith(b"10 20\r\n"), seen
                assert s.result.exit_code == 0

    asyncio.run(asyncio.wait_for(main(), 60))


def test_openapi_describes_terminals(warren):
    doc = warren.http.get("/openapi.json").json()
    assert "post" in doc["paths"]["/v1/sandboxes/{id}/execs/{exec_id}/resize"]
    assert "get" in doc["paths"]["/v1/sandboxes/{id}/exec/ws"]
    assert {"tty", "rows", "cols"} <= set(doc["components"]["schemas"]["ExecRequest"]["properties"])
    assert set(doc["components"]["schemas"]["WindowSize"]["required"]) == {"rows", "cols"}
