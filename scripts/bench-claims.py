#!/usr/bin/env python3
"""Warm-pool claims one at a time, each after the pool has refilled and the
machine has settled (`--gap` seconds), against one or more daemons in
rotating order, so that builds compared side by side see the same noise and
none is always the first to wake an idle machine. Prints, per daemon, the
client's p50 and minimum and the server's own mean with its claim phases
(from /metrics).

    scripts/bench-claims.py --n 60 http://127.0.0.1:7391=/tmp/a/home http://127.0.0.1:7392=/tmp/b/home

Each daemon needs busybox:latest; the pool `claims` is made and removed.
The client is Python's `http.client` on one kept-alive connection."""

import argparse
import http.client
import json
import re
import statistics
import time
import urllib.parse
from pathlib import Path

POOL = "claims"
SPEC = {"image": "busybox:latest", "memory": "64M"}


class Daemon:
    def __init__(self, arg):
        url, _, home = arg.partition("=")
        if not home:
            raise SystemExit(f"{arg!r}: give URL=HOME (the token is read from HOME/token)")
        u = urllib.parse.urlsplit(url)
        self.name = url
        self.conn = http.client.HTTPConnection(u.hostname, u.port or 80)
        self.token = "Bearer " + (Path(home) / "token").read_text().strip()
        self.times = []

    def call(self, method, path, body=None):
        headers = {"Authorization": self.token}
        if body is not None:
            body = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=body, headers=headers)
        r = self.conn.getresponse()
        data = r.read()
        if r.status >= 300:
            raise SystemExit(f"{self.name}: {method} {path}: {r.status} {data[:200]!r}")
        return data

    def wait_full(self, size):
        deadline = time.time() + 60
        while json.loads(self.call("GET", f"/v1/pools/{POOL}"))["ready"] < size:
            if time.time() > deadline:
                raise SystemExit(f"{self.name}: the pool did not fill in 60 s")
            time.sleep(0.02)

    def metrics(self):
        text = self.call("GET", "/metrics").decode()
        m = {f"phase {k}": float(v) for k, v in re.findall(r'warren_create_phase_seconds_sum\{phase="(claim_\w+)"\} ([\d.e+-]+)', text)}
        for k in ("sum", "count"):
            found = re.search(rf"^warren_sandbox_create_seconds_{k} ([\d.e+-]+)$", text, re.M)
            m[k] = float(found.group(1)) if found else 0.0
        return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40, help="claims per daemon")
    ap.add_argument("--size", type=int, default=4, help="the pool's size")
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between rounds, once every pool is full")
    ap.add_argument("daemons", nargs="+", metavar="URL=HOME")
    args = ap.parse_args()
    ds = [Daemon(a) for a in args.daemons]
    for d in ds:
        d.call("PUT", f"/v1/pools/{POOL}", {**SPEC, "size": args.size})
    try:
        for d in ds:
            d.wait_full(args.size)
        time.sleep(0.5)
        before = [d.metrics() for d in ds]
        for i in range(args.n):
            k = i % len(ds)
            for d in ds[k:] + ds[:k]:
                t = time.perf_counter()
                made = json.loads(d.call("POST", "/v1/sandboxes", SPEC))
                d.times.append((time.perf_counter() - t) * 1000)
                d.call("DELETE", f"/v1/sandboxes/{made['id']}")
            for d in ds:
                d.wait_full(args.size)
            time.sleep(args.gap)
        print("| daemon | claims | client p50 ms | client p99 ms | client min ms | server mean ms | phases (mean ms) |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for d, b in zip(ds, before):
            a = d.metrics()
            served = a["count"] - b["count"]
            server = (a["sum"] - b["sum"]) / served * 1000 if served else float("nan")
            phases = ", ".join(f"{k[6:]} {(a[k] - b.get(k, 0)) / args.n * 1000:.3f}" for k in sorted(a) if k.startswith("phase "))
            p99 = sorted(d.times)[min(len(d.times) - 1, round(0.99 * (len(d.times) - 1)))]
            print(f"| {d.name} | {len(d.times)} | {statistics.median(d.times):.2f} | {p99:.2f} | {min(d.times):.2f} | {server:.3f} | {phases} |")
    finally:
        for d in ds:
            try:
                d.call("DELETE", f"/v1/pools/{POOL}")
            except SystemExit:
                pass


if __name__ == "__main__":
    main()
