#!/usr/bin/env python3
"""What shipping logs to the control plane costs a node (issue 44).

One `warren server` and two nodes on this machine, in one run: node `on`
ships (the default), node `off` runs with --no-log-shipping. Each in turn
gets SANDBOXES sandboxes printing RATE lines a second in all (default 100
sandboxes, 1,000 lines/s), and the node agent's own CPU time (utime+stime of
its process, from /proc) is measured over SECONDS once they all print.

    cargo build -p warren
    python3 scripts/bench-log-shipping.py [--sandboxes 100] [--rate 1000] [--seconds 30]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from cluster import Cluster, Node, wait_until  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def kept_rows(server):
    """Lines the control plane holds (SQLite store of the server)."""
    import sqlite3
    db = sqlite3.connect(f"file:{server.home / 'warren.db'}?mode=ro", uri=True)
    (n,) = db.execute("SELECT COUNT(*) FROM sandbox_logs WHERE kind = 'log'").fetchone()
    db.close()
    return n


def measure(c, name, sandboxes, per_sandbox, seconds):
    node = c.nodes[name]
    for other in c.nodes:
        c.server.cli("node", "uncordon" if other == name else "cordon", other)
    pause_us = int(1_000_000 / per_sandbox)
    cmd = ["sh", "-c", f"while true; do echo \"a line of output from the benchmark $RANDOM\"; usleep {pause_us}; done"]
    ids = []
    for _ in range(sandboxes):
        r = c.server.http.post("/v1/sandboxes", json={
            "image": "busybox:latest", "cpu": 0.01, "memory": "16M", "labels": {"bench": name}, "cmd": cmd},
            timeout=120)
        assert r.status_code in (200, 201), r.text
        ids.append(r.json()["id"])
    time.sleep(5)  # all printing, samplers settled
    rows0 = kept_rows(c.server)
    t0, cpu0 = time.time(), cpu_seconds(node.proc.pid)
    time.sleep(seconds)
    t1, cpu1 = time.time(), cpu_seconds(node.proc.pid)
    rows1 = kept_rows(c.server)
    for sid in ids:
        c.server.http.delete(f"/v1/sandboxes/{sid}", timeout=120)
    share = (cpu1 - cpu0) / (t1 - t0)
    return share, (rows1 - rows0) / (t1 - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandboxes", type=int, default=100)
    ap.add_argument("--rate", type=int, default=1000, help="lines per second, all sandboxes together")
    ap.add_argument("--seconds", type=float, default=30)
    args = ap.parse_args()
    images = Path(tempfile.mkdtemp(prefix="warren-bench-img-"))
    oci = images / "busybox-oci.tar"
    subprocess.run([str(ROOT / "scripts" / "make-busybox-image.sh"), str(oci)], check=True, capture_output=True)
    with Cluster({"oci": oci}, nodes=[dict(name="on", cpu="2", memory="4G")]) as c:
        off = Node(c.base, c.server, "off", cpu="2", memory="4G")
        off.args.append("--no-log-shipping")
        off.start()
        c.nodes["off"] = off
        # Imported on every node that has joined (the cluster did it before `off`).
        c.server.cli("image", "import", str(oci), "--name", "busybox:latest")
        per = args.rate / args.sandboxes
        results = {}
        for name in ("off", "on"):
            results[name] = measure(c, name, args.sandboxes, per, args.seconds)
        cores = os.cpu_count()
        print(f"{args.sandboxes} sandboxes, {args.rate} lines/s in all, {args.seconds:.0f} s each, {cores} cores")
        for name, (share, kept) in results.items():
            print(f"  shipping {name:>3}: node agent CPU {share * 100:.1f}% of one core; lines kept centrally {kept:.0f}/s")
        cost = results["on"][0] - results["off"][0]
        print(f"  shipping costs {cost * 100:.1f}% of one core, "
              f"{cost / results['off'][0] * 100:.0f}% more node agent CPU, "
              f"{cost / cores * 100:.1f}% of the node's {cores} cores")


if __name__ == "__main__":
    main()
