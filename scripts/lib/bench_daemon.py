"""A `warren up` of a benchmark's own: started on a free port, waited for
until healthy, and stopped (SIGINT, then SIGKILL) with its directory removed.
Shared by scripts/bench-console.py and scripts/bench-restart.py."""

import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(warren, home, port, log, extra_args=(), timeout=120):
    """Starts `warren up` and returns (process, seconds to its first HTTP
    answer, seconds until /healthz said ok); exits the script if it dies
    or is not healthy within `timeout` seconds."""
    proc = subprocess.Popen(
        [warren, "up", "--home", str(home), "--listen", f"127.0.0.1:{port}", *extra_args],
        stdout=log, stderr=log,
    )
    t0 = time.monotonic()
    first = None
    while True:
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            first = first or time.monotonic() - t0
            if r.text.strip() == "ok":
                return proc, first, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            sys.exit(f"warren up exited with {proc.returncode}")
        if time.monotonic() - t0 > timeout:
            sys.exit(f"warren up did not become healthy in {timeout} s")
        time.sleep(0.01)


def stop(proc, base):
    """Stops the daemon cleanly (it destroys its sandboxes) and removes `base`."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(base, ignore_errors=True)
