#!/usr/bin/env python3
"""Create latency from a warm pool vs a plain create, in the same run:
sets a pool of --size ready sandboxes, times --n creates that it serves
(each destroyed at once, waiting for the pool to refill between rounds so
every create finds a ready one), then --n plain creates of another size.

    WARREN_URL=... WARREN_HOME=... scripts/bench-pool.py --n 60

Needs a `warren up` with busybox:latest; removes its pool and sandboxes."""

import argparse
import os
import statistics
import time
from pathlib import Path

import httpx


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--size", type=int, default=8)
    ap.add_argument("--image", default="busybox:latest")
    args = ap.parse_args()
    url = os.environ.get("WARREN_URL", "http://127.0.0.1:7070")
    token = os.environ.get("WARREN_TOKEN") or (Path(os.environ.get("WARREN_HOME", "/var/lib/warren")) / "token").read_text().strip()
    c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
    name = f"bench{os.getpid()}"
    c.put(f"/v1/pools/{name}", json={"image": args.image, "memory": "64M", "size": args.size}).raise_for_status()

    def wait_full():
        deadline = time.time() + 60
        while c.get(f"/v1/pools/{name}").json()["ready"] < args.size:
            if time.time() > deadline:
                raise SystemExit("the pool did not fill in 60 s")
            time.sleep(0.02)

    def timed(spec):
        t = time.perf_counter()
        r = c.post("/v1/sandboxes", json=spec)
        ms = (time.perf_counter() - t) * 1000
        r.raise_for_status()
        return ms, r.json()["id"]

    pooled, plain, made = [], [], []
    try:
        while len(pooled) < args.n:
            wait_full()
            for _ in range(min(args.size, args.n - len(pooled))):
                ms, sid = timed({"image": args.image, "memory": "64M", "labels": {"bench": name}, "ttl": "10m"})
                pooled.append(ms)
                made.append(sid)
            for sid in made:
                c.delete(f"/v1/sandboxes/{sid}")
            made.clear()
        for _ in range(args.n):
            ms, sid = timed({"image": args.image, "memory": "80M", "labels": {"bench": name}})
            plain.append(ms)
            c.delete(f"/v1/sandboxes/{sid}")
        claimed = c.get(f"/v1/pools/{name}").json()["claimed"]
    finally:
        c.delete(f"/v1/pools/{name}")
        c.request("DELETE", "/v1/sandboxes", params={"label": f"bench={name}"})
    print("| create | n | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    print(f"| from a warm pool ({claimed} served) | {len(pooled)} | {statistics.median(pooled):.2f} | {pct(pooled, 99):.2f} |")
    print(f"| plain | {len(plain)} | {statistics.median(plain):.2f} | {pct(plain, 99):.2f} |")


if __name__ == "__main__":
    main()
