#!/usr/bin/env python3
"""Lifecycle soak for docs/benchmarks.md (issue targets, not CI):

1. 1,000 sandboxes with random TTLs from 1 s to 2 min: every one reaped within
   TTL + 2 s, none early.
2. kill -9 of `warren up` with 200 running sandboxes, restart: share adopted
   and time from restart to serving.
3. 5,000 create/exec/destroy cycles: leaked mounts, cgroups, processes and
   directories, and the daemon's RSS and fd count before and after.

Usage: scripts/soak.py [--ttl-count 1000] [--restart-count 200] [--cycles 5000]
(run as root; uses target/release/warren and scripts/make-busybox-image.sh)."""

import argparse
import asyncio
import datetime as dt
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release" / "warren"
SMALL = {"image": "busybox:latest", "cpu": 0.1, "memory": "16M"}


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, home, port):
        self.home, self.port, self.url = home, port, f"http://127.0.0.1:{port}"

    def start(self):
        t = time.monotonic()
        self.proc = subprocess.Popen([str(BIN), "up", "--home", str(self.home), "--listen", f"127.0.0.1:{self.port}",
                                      "--max-sandboxes", "2000", "--cpu-overcommit", "64"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.home.parent / "up.log", "ab"))
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        self.ready_s = time.monotonic() - t
        token = (self.home / "token").read_text().strip()
        self.headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=120)

    def rss_fds(self):
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        rss = int(next(l for l in status.splitlines() if l.startswith("VmRSS:")).split()[1]) / 1024
        return rss, len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def ts(s):
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


async def create_many(d, n, specs):
    sem = asyncio.Semaphore(8)
    async with httpx.AsyncClient(base_url=d.url, headers=d.headers, timeout=120) as c:
        async def one(spec):
            async with sem:
                r = await c.post("/v1/sandboxes", json=spec)
                r.raise_for_status()
                return r.json()
        return await asyncio.gather(*(one(s) for s in specs))


def ttl_soak(d, n):
    rng = random.Random(7)
    ttls = [rng.uniform(1, 120) for _ in range(n)]
    t = time.monotonic()
    infos = asyncio.run(create_many(d, n, [{**SMALL, "ttl": f"{int(x * 1000)}ms"} for x in ttls]))
    print(f"ttl soak: {n} sandboxes created in {time.monotonic() - t:.1f} s", flush=True)
    ttl_of = {i["id"]: x for i, x in zip(infos, ttls)}
    deadline = time.monotonic() + max(ttls) + 30
    while time.monotonic() < deadline:
        if not d.http.get("/v1/sandboxes").json():
            break
        time.sleep(1)
    late, early, missing = [], 0, 0
    for sid, ttl in ttl_of.items():
        evs = d.http.get("/v1/events", params={"sandbox": sid}).json()
        created = next(e for e in evs if e["state"] == "creating")
        ready = next(e for e in evs if e["state"] == "running")
        done = next((e for e in evs if e["state"] == "destroyed"), None)
        if done is None or done["reason"] != "ttl_expired":
            missing += 1
            continue
        if ts(done["time"]) < ts(created["time"]) + ttl:
            early += 1
        late.append(ts(done["time"]) - (ts(ready["time"]) + ttl))
    late.sort()
    print(f"ttl soak: reaped {len(late)}/{n}, early {early}, missing {missing}; lateness after TTL "
          f"p50 {late[len(late) // 2] * 1000:.0f} ms, p99 {late[int(len(late) * 0.99)] * 1000:.0f} ms, "
          f"max {late[-1] * 1000:.0f} ms (bound 2000 ms)", flush=True)


def restart_soak(d, n):
    infos = asyncio.run(create_many(d, n, [SMALL] * n))
    ids = [i["id"] for i in infos]
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    d.start()
    running = {s["id"] for s in d.http.get("/v1/sandboxes", params={"state": "running"}).json()}
    adopted = sum(1 for i in ids if i in running)
    ok = 0
    for sid in ids:
        with d.http.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]}) as r:
            ok += r.status_code == 200 and '"exit","code":0' in r.read().decode()
    print(f"restart: kill -9 with {n} running; restart to serving {d.ready_s:.2f} s; adopted {adopted}/{n}; "
          f"exec ok {ok}/{n}", flush=True)
    for sid in ids:
        d.http.delete(f"/v1/sandboxes/{sid}")


def host_leaks(d):
    mounts = sum(1 for l in open("/proc/self/mountinfo") if str(d.home) in l)
    cgroups = sum(len([p for p in (c / "warren").iterdir() if p.is_dir()])
                  for c in Path("/sys/fs/cgroup").iterdir() if (c / "warren").is_dir())
    dirs = len(list((d.home / "sandboxes").iterdir())) + len(list((d.home / "run").iterdir()))
    procs = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                procs += "/warren/sbx-" in (p / "cgroup").read_text()
            except OSError:
                pass
    return {"mounts": mounts, "cgroups": cgroups, "dirs": dirs, "processes": procs}


def cycle_soak(d, n):
    before = d.rss_fds()

    async def run():
        sem = asyncio.Semaphore(8)
        async with httpx.AsyncClient(base_url=d.url, headers=d.headers, timeout=120) as c:
            async def one():
                async with sem:
                    r = await c.post("/v1/sandboxes", json=SMALL)
                    r.raise_for_status()
                    sid = r.json()["id"]
                    async with c.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]}) as e:
                        await e.aread()
                    (await c.delete(f"/v1/sandboxes/{sid}")).raise_for_status()
            await asyncio.gather(*(one() for _ in range(n)))

    t = time.monotonic()
    asyncio.run(run())
    took = time.monotonic() - t
    after = d.rss_fds()
    print(f"cycles: {n} create/exec/destroy in {took:.1f} s ({n / took:.0f}/s at concurrency 8); "
          f"leaks {host_leaks(d)}; daemon RSS {before[0]:.1f} -> {after[0]:.1f} MiB, fds {before[1]} -> {after[1]}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ttl-count", type=int, default=1000)
    ap.add_argument("--restart-count", type=int, default=200)
    ap.add_argument("--cycles", type=int, default=5000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warren-soak-"))
    d = Daemon(work / "home", port())
    d.home.mkdir()
    try:
        img = work / "busybox.tar"
        subprocess.run([str(ROOT / "scripts" / "make-busybox-image.sh"), str(img)], check=True, stdout=subprocess.DEVNULL)
        d.start()
        subprocess.run([str(BIN), "image", "import", str(img), "--name", "busybox:latest"], check=True,
                       env={**os.environ, "WARREN_URL": d.url, "WARREN_HOME": str(d.home)}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        print(f"## soak {dt.date.today()} on {os.cpu_count()} cores", flush=True)
        if a.ttl_count:
            ttl_soak(d, a.ttl_count)
        if a.restart_count:
            restart_soak(d, a.restart_count)
        if a.cycles:
            cycle_soak(d, a.cycles)
    finally:
        d.proc.send_signal(signal.SIGINT)
        d.proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
