#!/usr/bin/env python3
"""Fork latency against plain creates, in one run: a source sandbox with
--mb MB of changes in --files files is forked into --count children,
--rounds times; each fork's time per child (the fork's wall time / count)
is compared with a plain create's (single creates, one after another),
and with --count creates sent at once. With --with-processes, every
sandbox is a gvisor one running a main process, and the fork carries the
source's memory and processes too (the source is saved, copied and
resumed; each child resumes the image). Prints a Markdown table;
everything it made carries one label and is removed at the end, also
when interrupted.

    cargo build --release -p warren
    target/release/warren up --home /tmp/wb &
    WARREN_URL=http://127.0.0.1:7070 WARREN_HOME=/tmp/wb scripts/bench-fork.py

Needs a `warren up` with busybox:latest (scripts/make-busybox-image.sh)."""

import argparse
import concurrent.futures
import os
import re
import statistics
import sys
import time
from pathlib import Path

import httpx


def client():
    url = os.environ.get("WARREN_URL", "http://127.0.0.1:7070")
    home = Path(os.environ.get("WARREN_HOME", "/var/lib/warren"))
    token = os.environ.get("WARREN_TOKEN") or (home / "token").read_text().strip()
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300)


def ok(r):
    if r.status_code >= 300:
        sys.exit(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text}")
    return r.json()


def sh(c, sid, script):
    """Runs a script in the sandbox; exits the benchmark if it fails."""
    with c.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": ["sh", "-c", script]}) as r:
        if r.status_code != 200:
            r.read()
            sys.exit(f"exec: {r.status_code} {r.text}")
        lines = [line for line in r.iter_lines() if line]
    if '"type":"exit","code":0' not in lines[-1].replace(" ", ""):
        sys.exit(f"exec failed: {lines[-3:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10, help="forks timed")
    ap.add_argument("--count", type=int, default=8, help="children per fork")
    ap.add_argument("--mb", type=int, default=50, help="MB of changes in the source")
    ap.add_argument("--files", type=int, default=500, help="files they are spread over")
    ap.add_argument("--creates", type=int, default=30, help="plain creates timed")
    ap.add_argument("--image", default="busybox:latest")
    ap.add_argument("--with-processes", action="store_true",
                    help="gvisor sandboxes with a main process, forked with their processes")
    ap.add_argument("--memory-mb", type=int, default=0,
                    help="with --with-processes: MB the source holds in memory (gVisor's /dev/shm)")
    args = ap.parse_args()
    label = f"bench-fork-{os.getpid()}"
    spec = {"image": args.image, "labels": {"bench": label}}
    if args.with_processes:
        spec |= {"isolation": "gvisor", "cmd": ["sh", "-c", "while true; do sleep 1; done"]}
    fork_body = {"count": args.count, "with_processes": args.with_processes}
    c = client()
    each_kb = args.mb * 1024 // args.files
    fill = (
        f"mkdir -p /data && i=0; while [ $i -lt {args.files} ]; do "
        f"head -c {each_kb * 1024} /dev/urandom > /data/f$i; i=$((i+1)); done; sync"
    )
    plain, burst, per_child, walls, frozen, images = [], [], [], [], [], []
    try:
        print(f"plain creates: {args.creates}", file=sys.stderr)
        for _ in range(args.creates):
            t = time.perf_counter()
            info = ok(c.post("/v1/sandboxes", json=spec))
            plain.append((time.perf_counter() - t) * 1000)
            c.delete(f"/v1/sandboxes/{info['id']}")
        for rnd in range(args.rounds):
            # The same number of plain creates at once, for comparison.
            with concurrent.futures.ThreadPoolExecutor(args.count) as pool:
                def one(_):
                    with client() as cc:
                        return ok(cc.post("/v1/sandboxes", json=spec))["id"]
                t = time.perf_counter()
                ids = list(pool.map(one, range(args.count)))
                burst.append((time.perf_counter() - t) * 1000 / args.count)
            for sid in ids:
                c.delete(f"/v1/sandboxes/{sid}")
            src = ok(c.post("/v1/sandboxes", json=spec))["id"]
            sh(c, src, fill)
            if args.memory_mb:
                sh(c, src, f"head -c {args.memory_mb << 20} /dev/urandom > /dev/shm/held")
            t = time.perf_counter()
            children = ok(c.post(f"/v1/sandboxes/{src}/fork", json=fork_body))
            wall = (time.perf_counter() - t) * 1000
            walls.append(wall)
            per_child.append(wall / args.count)
            events = ok(c.get(f"/v1/sandboxes/{src}"))["events"]
            note = next(e["message"] for e in events if e["reason"] == "forked")
            m = re.search(r"(?:frozen|stopped) (\d+) ms", note)
            frozen.append(int(m.group(1)) if m else 0)
            m = re.search(r"(\d+) bytes of memory image", note)
            if args.memory_mb:
                sh(c, children[0]["id"], f"test $(wc -c < /dev/shm/held) -eq {args.memory_mb << 20}")
            images.append(int(m.group(1)) if m else 0)
            sh(c, children[0]["id"], f"test $(ls /data | wc -l) -eq {args.files}")
            for s in [src] + [ch["id"] for ch in children]:
                c.delete(f"/v1/sandboxes/{s}")
            print(
                f"round {rnd + 1}/{args.rounds}: fork of {args.mb} MB into {args.count}: "
                f"{wall:.0f} ms ({wall / args.count:.1f} ms per child; source frozen or stopped {frozen[-1]} ms)",
                file=sys.stderr,
            )
    finally:
        gone = c.request("DELETE", "/v1/sandboxes", params={"label": f"bench={label}"}).json()
        if gone:
            print(f"removed {len(gone)} sandboxes", file=sys.stderr)
    p50 = statistics.median
    base = p50(plain)
    what = f"gvisor, with processes ({args.memory_mb} MB held in memory)" if args.with_processes else "files only"
    print(f"| {what}: {args.mb} MB in {args.files} files, {args.count} children, {args.rounds} rounds | p50 ms | vs plain create |")
    print("|---|---:|---:|")
    print(f"| plain create, one at a time | {base:.1f} | 1.00x |")
    print(f"| plain create, {args.count} at once, per sandbox | {p50(burst):.1f} | {p50(burst) / base:.2f}x |")
    print(f"| fork, per child (fork wall time / {args.count}) | {p50(per_child):.1f} | {p50(per_child) / base:.2f}x |")
    print(f"| fork, wall time for all {args.count} | {p50(walls):.1f} | |")
    if args.with_processes:
        print(f"| source stopped (saved, copied, resumed) | {p50(frozen):.0f} | |")
        print(f"| memory image, MB | {p50(images) / 1e6:.1f} | |")
    else:
        print(f"| source frozen for the copy | {p50(frozen):.0f} | |")


if __name__ == "__main__":
    main()
