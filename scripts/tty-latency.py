#!/usr/bin/env python3
"""Keystroke echo round trip of a terminal exec: a key typed until its echo
comes back, through each way a client can drive a terminal.

  cli   `warren exec -it ID -- sh` on a pseudo-terminal of this script: the
        key is written to that terminal, the echo read from it (end to end:
        CLI, exec WebSocket, control plane, node, the sandbox's pty, sh)
  ws    the exec WebSocket directly (tests/helpers.py's minimal client)
  http  POST .../execs/{exec_id}/stdin per key, echo read from the NDJSON
        exec stream

Usage (against a running `warren up` with busybox:latest imported):
  WARREN_URL=http://127.0.0.1:7070 WARREN_HOME=/var/lib/warren \\
      scripts/tty-latency.py [--keys 300] [--bin target/release/warren] [--modes cli,ws,http]

Prints p50/p90/p99/max in milliseconds per mode. Creates one sandbox and
destroys it at the end."""

import argparse
import base64
import json
import os
import pty
import re
import select
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers import WebSocket  # noqa: E402

PROMPT = re.compile(rb"# ")
# ash's line editing redraws the line at a length; a kill-line every so
# often keeps the line short, like typing does.
KILL_EVERY = 40


def report(name, samples):
    ms = sorted(s * 1000 for s in samples)
    q = statistics.quantiles(ms, n=100)
    print(f"{name:5} n={len(ms):4}  p50 {q[49]:6.2f} ms  p90 {q[89]:6.2f} ms  "
          f"p99 {q[98]:6.2f} ms  max {ms[-1]:6.2f} ms")


def measure(keys, send, wait_echo, kill_line):
    samples = []
    for i in range(keys):
        if i and i % KILL_EVERY == 0:
            kill_line()
        t0 = time.perf_counter()
        send(b"x")
        wait_echo()
        samples.append(time.perf_counter() - t0)
    return samples


def cli_mode(args, sid):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(args.bin, [args.bin, "exec", "-it", sid, "--", "sh"])
    buf = bytearray()

    def read_until(rx, timeout=10):
        deadline = time.time() + timeout
        while True:
            m = rx.search(buf)
            if m:
                del buf[: m.end()]
                return
            r, _, _ = select.select([fd], [], [], max(0, deadline - time.time()))
            if not r:
                raise SystemExit(f"cli: no {rx.pattern!r} in {bytes(buf)!r}")
            buf.extend(os.read(fd, 4096))

    read_until(PROMPT)
    x = re.compile(rb"x")
    samples = measure(args.keys, lambda b: os.write(fd, b), lambda: read_until(x),
                      lambda: (os.write(fd, b"\x15"), time.sleep(0.05), buf.clear()))
    os.write(fd, b"\x15exit\n")
    os.waitpid(pid, 0)
    return samples


def ws_mode(args, url, token, sid):
    ws = WebSocket(url, f"/v1/sandboxes/{sid}/exec/ws", token=token)
    assert ws.status == 101, ws.body
    ws.send(json.dumps({"cmd": ["sh"], "tty": True}))
    buf = bytearray()

    def read_until(rx):
        while True:
            m = rx.search(buf)
            if m:
                del buf[: m.end()]
                return
            kind, payload = ws.recv()
            if kind == "binary":
                buf.extend(payload)
            elif kind == "close":
                raise SystemExit(f"ws: closed {payload}")

    read_until(PROMPT)
    x = re.compile(rb"x")
    samples = measure(args.keys, ws.send, lambda: read_until(x),
                      lambda: (ws.send(b"\x15"), time.sleep(0.05), buf.clear()))
    ws.send(b"\x15exit\n")
    ws.close()
    return samples


def http_mode(args, http, sid):
    cond = threading.Condition()
    state = {"out": bytearray(), "exec_id": None}

    def read():
        with http.stream("POST", f"/v1/sandboxes/{sid}/exec",
                         json={"cmd": ["sh"], "tty": True, "stdin_open": True}) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                ev = json.loads(line)
                with cond:
                    if ev["type"] == "start":
                        state["exec_id"] = ev["exec_id"]
                    elif ev["type"] == "stdout":
                        state["out"].extend(base64.b64decode(ev["data"]))
                    cond.notify_all()
                if ev["type"] == "exit":
                    return

    threading.Thread(target=read, daemon=True).start()

    def read_until(rx):
        with cond:
            while not (m := rx.search(state["out"])):
                if not cond.wait(10):
                    raise SystemExit(f"http: no {rx.pattern!r} in {bytes(state['out'])!r}")
            del state["out"][: m.end()]

    read_until(PROMPT)
    sender = httpx.Client(base_url=http.base_url, headers=http.headers, timeout=30)
    stdin = f"/v1/sandboxes/{sid}/execs/{state['exec_id']}/stdin"

    def kill_line():
        sender.post(stdin, content=b"\x15")
        time.sleep(0.05)
        with cond:
            state["out"].clear()

    x = re.compile(rb"x")
    samples = measure(args.keys, lambda b: sender.post(stdin, content=b), lambda: read_until(x), kill_line)
    sender.post(stdin, content=b"\x15exit\n")
    return samples


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=300)
    p.add_argument("--bin", default=os.environ.get("WARREN_BIN", str(ROOT / "target" / "debug" / "warren")))
    p.add_argument("--image", default="busybox:latest")
    p.add_argument("--modes", default="cli,ws,http")
    args = p.parse_args()
    url = os.environ.get("WARREN_URL", "http://127.0.0.1:7070")
    token = os.environ.get("WARREN_TOKEN") or (
        Path(os.environ.get("WARREN_HOME", "/var/lib/warren")) / "token").read_text().strip()
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    r = http.post("/v1/sandboxes", json={"image": args.image})
    r.raise_for_status()
    sid = r.json()["id"]
    try:
        for mode in args.modes.split(","):
            if mode == "cli":
                report("cli", cli_mode(args, sid))
            elif mode == "ws":
                report("ws", ws_mode(args, url, token, sid))
            elif mode == "http":
                report("http", http_mode(args, http, sid))
            else:
                raise SystemExit(f"unknown mode {mode!r}")
    finally:
        http.delete(f"/v1/sandboxes/{sid}")


if __name__ == "__main__":
    main()
