#!/usr/bin/env python3
"""How long a restarted daemon takes to answer with many sandboxes alive in
mixed states (docs/reliability.md).

    python3 scripts/bench-restart.py [--count 1000] [--warren target/release/warren]

Starts its own `warren up`, creates COUNT small sandboxes (16M, 0.05 CPU):
60% idle, 20% with a main process that sleeps, 10% paused, 10% kept (a main
process that exits, reclaim `keep`), then `kill -9`s the daemon, starts it
again on the same home and measures the time until `/healthz` answers at all
and until it answers `ok` (every sandbox taken over), and checks that every
sandbox is back in its state. Removes everything at the end. Run as root.
"""

import argparse
import concurrent.futures
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
from bench_daemon import free_port, start, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--warren", default=str(ROOT / "target" / "release" / "warren"))
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="warren-bench-restart-"))
    home, port = base / "home", free_port()
    home.mkdir()
    log = open(base / "daemon.log", "ab")
    proc, _, _ = start(args.warren, home, port, log, ("--cpu-overcommit", "128"))
    try:
        token = (home / "token").read_text().strip()
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=120)
        image = base / "busybox.tar"
        subprocess.run([ROOT / "scripts" / "make-busybox-image.sh", image], check=True, capture_output=True)
        r = http.post("/v1/images/import", params={"name": "busybox:latest"}, content=image.read_bytes())
        assert r.status_code == 201, r.text

        def create(i):
            spec = {"image": "busybox:latest", "cpu": 0.05, "memory": "16M", "labels": {"bench": "restart"}}
            kind = "idle"
            if i % 10 in (6, 7):
                spec["cmd"], kind = ["sleep", "100000"], "main"
            elif i % 10 == 8:
                kind = "paused"
            elif i % 10 == 9:
                spec["cmd"], spec["reclaim"], kind = ["true"], "keep", "kept"
            r = http.post("/v1/sandboxes", json=spec)
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            if kind == "paused":
                assert http.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
            return sid, kind

        t = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            made = list(pool.map(create, range(args.count)))
        print(f"created {len(made)} sandboxes in {time.monotonic() - t:.1f}s", flush=True)
        want = {"idle": "running", "main": "running", "paused": "paused", "kept": "kept"}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = {s["id"]: s["state"] for s in http.get("/v1/sandboxes").json()}
            if all(states.get(sid) == want[k] for sid, k in made):
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, first, ok = start(args.warren, home, port, log, ("--cpu-overcommit", "128"))
        print(f"restart with {args.count} sandboxes: /healthz answered after {first:.3f}s, 'ok' after {ok:.3f}s", flush=True)
        states = {s["id"]: s["state"] for s in http.get("/v1/sandboxes").json()}
        wrong = [(sid, k, states.get(sid)) for sid, k in made if states.get(sid) != want[k]]
        print(f"sandboxes back in their state: {len(made) - len(wrong)} of {len(made)}", flush=True)
        if wrong:
            print("not:", wrong[:10])
        http.delete("/v1/sandboxes", params={"label": "bench=restart"}, timeout=600)
        return 1 if wrong or ok > 2.0 else 0
    finally:
        stop(proc, base)


if __name__ == "__main__":
    sys.exit(main())
