#!/usr/bin/env python3
"""Create latency as the number of live sandboxes grows: at each level of
--live, fills the node to that many idle sandboxes of default sizes (with
progress), then times --samples single creates (each destroyed at once)
and prints a Markdown row per level. Everything it made carries one label
and is removed at the end, also when interrupted.

    WARREN_URL=... WARREN_HOME=... scripts/bench-live.py --live 0,1000,5000

Needs a `warren up` (or server) with busybox:latest; default flags admit
thousands of default-sized sandboxes (10m / 16M requests)."""

import argparse
import concurrent.futures
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def endpoint():
    """The daemon's URL and token, from the environment."""
    url = os.environ.get("WARREN_URL", "http://127.0.0.1:7070")
    token = os.environ.get("WARREN_TOKEN") or (Path(os.environ.get("WARREN_HOME", "/var/lib/warren")) / "token").read_text().strip()
    return url, token


def client():
    url, token = endpoint()
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)


def phase_totals(c):
    """(sum seconds, count) of each create phase in the daemon's /metrics."""
    out = {}
    for line in c.get("/metrics").text.splitlines():
        for kind in ("sum", "count"):
            prefix = f"warren_create_phase_seconds_{kind}{{phase=\""
            if line.startswith(prefix):
                name, value = line[len(prefix):].split('"} ')
                out.setdefault(name, [0.0, 0.0])[kind == "count"] = float(value)
    return out


def phase_mean_ms(before, after, name):
    s0, n0 = before.get(name, (0.0, 0.0))
    s1, n1 = after.get(name, (0.0, 0.0))
    return (s1 - s0) / (n1 - n0) * 1000 if n1 > n0 else float("nan")


def run_burst(spec, n):
    """n creates released together on n connections by ApacheBench (`ab`,
    from apache2-utils: one event loop in C, so all n are in flight at once,
    which threads of Python cannot do); returns (n, failures, p50 ms, p99
    ms, wall s). The sandboxes carry the benchmark's label and go with the
    rest."""
    url, token = endpoint()
    with tempfile.TemporaryDirectory() as tmp:
        body, times = Path(tmp) / "spec.json", Path(tmp) / "times.tsv"
        body.write_text(json.dumps(spec))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 256)), hard))
        out = subprocess.run(
            ["ab", "-q", "-n", str(n), "-c", str(n), "-s", "600", "-p", str(body), "-T", "application/json",
             "-H", f"Authorization: Bearer {token}", "-g", str(times), f"{url}/v1/sandboxes"],
            capture_output=True, text=True, check=True,
        ).stdout
        # One row per request: start, seconds, connect, processing, total ms, wait.
        rows = [line.split("\t") for line in times.read_text().splitlines()[1:]]
    lat = [float(r[4]) for r in rows]
    wall = float(re.search(r"Time taken for tests:\s+([\d.]+) seconds", out).group(1))
    # `ab` counts a body of another length than the first as failed: every
    # sandbox's answer differs in length, so only the rest are failures.
    failed = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: \d+, Exceptions: (\d+)\)", out)
    non_2xx = re.search(r"Non-2xx responses:\s+(\d+)", out)
    failures = sum(int(x) for x in failed.groups()) if failed else 0
    failures += int(non_2xx.group(1)) if non_2xx else 0
    print(f"burst {n}: {failures} failed, p50 {pct(lat, 50):.0f} ms, p99 {pct(lat, 99):.0f} ms", file=sys.stderr)
    return n, failures, pct(lat, 50), pct(lat, 99), wall


def fill_pool(c, name, spec, n):
    """A warm pool of n ready sandboxes of the burst's spec, full before
    the burst starts. The burst's creates carry the benchmark's label and
    claim the members; the pool's leftovers go with the pool."""
    c.put(f"/v1/pools/{name}", json={"image": spec["image"], "size": n}).raise_for_status()
    t0 = time.time()
    ready = -1
    while ready < n:
        now = c.get(f"/v1/pools/{name}").json()["ready"]
        if now != ready and (now // 100 != ready // 100 or now == n):
            print(f"pool: {now}/{n} ready ({time.time() - t0:.0f} s)", file=sys.stderr)
        ready = now
        if time.time() - t0 > 900:
            raise SystemExit(f"the pool did not fill in 900 s ({ready}/{n} ready)")
        time.sleep(0.5)
    # Let the refill's last creates and their clean-up settle.
    time.sleep(5)


def cpu_of(pids, settle=15, window=30):
    """Each process's CPU use over the same `window` seconds, `settle`
    seconds after the fill, in percent of one core (user + system, all its
    threads)."""
    def ticks(pid):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    time.sleep(settle)
    t0 = {pid: ticks(pid) for pid in pids}
    time.sleep(window)
    return {pid: (ticks(pid) - t0[pid]) * 100 / os.sysconf("SC_CLK_TCK") / window for pid in pids}


def process_name(pid):
    return Path(f"/proc/{pid}/comm").read_text().strip()


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--live", default="0,1000", help="comma-separated live counts, increasing")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--fill-concurrency", type=int, default=16)
    ap.add_argument("--image", default="busybox:latest")
    ap.add_argument("--burst", type=int, default=0, metavar="N",
                    help="after the levels, send N creates all at once (N connections) and report failures and p50/p99")
    ap.add_argument("--burst-pool", action="store_true",
                    help="serve the burst from a warm pool: first keep N ready sandboxes of the burst's spec, "
                         "then send the N creates (each claims one)")
    ap.add_argument("--fill-request", metavar="CPU,MEMORY",
                    help="requests of the filling sandboxes, e.g. 1m,4M to fit 5,000 on a small node (default: default sizes)")
    ap.add_argument("--daemon-pid", type=int, metavar="PID",
                    help="also report the daemon's CPU (%% of a core, from /proc/PID/stat) over 30 s at each level, 15 s after filling")
    ap.add_argument("--watch-pid", type=int, action="append", default=[], metavar="PID",
                    help="with --daemon-pid, report this host process's CPU over the same window too "
                         "(repeatable; e.g. PID 1 and kdamond, whose work grows with the process count)")
    args = ap.parse_args()
    label = f"bench-live-{os.getpid()}"
    spec = {"image": args.image, "labels": {"bench": label}}
    fill = dict(spec)
    if args.fill_request:
        cpu, mem = args.fill_request.split(",")
        fill.update(cpu_request=cpu, memory_request=mem)
    c = client()
    live = 0
    rows = []
    base = None
    burst = None
    claimed = None
    phases = {}
    idle_cpu = {}
    watched = {}
    if args.daemon_pid:
        watched = {args.daemon_pid: "daemon"} | {pid: f"{process_name(pid)} (pid {pid})" for pid in args.watch_pid}
    try:
        for level in [int(x) for x in args.live.split(",")]:
            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(args.fill_concurrency) as pool:
                def one(_):
                    with client() as cc:
                        r = cc.post("/v1/sandboxes", json=fill)
                        r.raise_for_status()
                futs = [pool.submit(one, i) for i in range(level - live)]
                for i, f in enumerate(concurrent.futures.as_completed(futs), 1):
                    f.result()
                    if i % 100 == 0 or i == len(futs):
                        print(f"fill: {live + i}/{level} live ({time.time() - t0:.0f} s)", file=sys.stderr)
            live = level
            if args.daemon_pid:
                idle_cpu[level] = cpu_of(list(watched))
                shown = ", ".join(f"{name} {idle_cpu[level][pid]:.1f}%" for pid, name in watched.items())
                print(f"live {level}: idle, % of a core: {shown}", file=sys.stderr)
            lat = []
            before = phase_totals(c)
            for _ in range(args.samples):
                t = time.perf_counter()
                r = c.post("/v1/sandboxes", json=spec)
                lat.append((time.perf_counter() - t) * 1000)
                r.raise_for_status()
                c.delete(f"/v1/sandboxes/{r.json()['id']}")
            p50 = statistics.median(lat)
            base = base or p50
            after = phase_totals(c)
            # The spawner's build: cgroups, namespaces, the init in its cgroups.
            build = phase_mean_ms(before, after, "spawn_build")
            rows.append((level, p50, pct(lat, 99), p50 / base, build))
            phases[level] = {name: phase_mean_ms(before, after, name) for name in after}
            print(f"live {level}: create p50 {p50:.1f} ms, p99 {pct(lat, 99):.1f} ms", file=sys.stderr)
        if args.burst:
            if args.burst_pool:
                fill_pool(c, label, spec, args.burst)
            burst = run_burst(spec, args.burst)
            if args.burst_pool:
                claimed = c.get(f"/v1/pools/{label}").json()["claimed"]
                print(f"burst: {claimed} of {args.burst} served from the pool", file=sys.stderr)
    finally:
        if args.burst_pool:
            c.delete(f"/v1/pools/{label}", timeout=600)
        t = time.time()
        r = c.request("DELETE", "/v1/sandboxes", params={"label": f"bench={label}"}, timeout=600)
        if r.status_code == 200:
            print(f"removed {len(r.json())} sandboxes in {time.time() - t:.1f} s", file=sys.stderr)
        else:
            print(f"removing the sandboxes failed: {r.text}; run `warren rm --label bench={label}`", file=sys.stderr)
    print("| live sandboxes | create p50 ms | create p99 ms | p50 vs empty | spawn_build mean ms |")
    print("|---:|---:|---:|---:|---:|")
    for level, p50, p99, ratio, build in rows:
        print(f"| {level} | {p50:.1f} | {p99:.1f} | {ratio:.2f}x | {build:.1f} |")
    if idle_cpu:
        print("\n| live sandboxes | " + " | ".join(f"idle {name} CPU, % of a core" for name in watched.values()) + " |")
        print("|---:|" + "---:|" * len(watched))
        for level, by_pid in idle_cpu.items():
            print(f"| {level} | " + " | ".join(f"{by_pid[pid]:.1f}" for pid in watched) + " |")
    # Where the growth is: each create phase's mean at each level (the
    # phases overlap: node_create holds the node's and spawner's own).
    names = sorted({n for by in phases.values() for n, ms in by.items() if ms >= 0.05})
    if names:
        levels = list(phases)
        print("\n| phase mean ms | " + " | ".join(f"{lv} live" for lv in levels) + " |")
        print("|---|" + "---:|" * len(levels))
        for name in names:
            print(f"| {name} | " + " | ".join(f"{phases[lv].get(name, 0.0):.2f}" for lv in levels) + " |")
    if burst:
        n, failures, p50, p99, wall = burst
        served = f" ({claimed} of them claimed from a warm pool of {n})" if claimed is not None else ""
        print(f"\nBurst of {n} creates sent at once{served}: {failures} failed, p50 {p50:.0f} ms, p99 {p99:.0f} ms, all answered in {wall:.1f} s")


if __name__ == "__main__":
    main()
