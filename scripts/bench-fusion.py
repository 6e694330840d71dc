#!/usr/bin/env python3
"""SandboxFusion `/run_code` on Warren: latency and throughput of a trivial
python program (`print(1)`), each call in a fresh sandbox.

    scripts/bench-fusion.py --bin target/release/warren            # its own `warren up`
    scripts/bench-fusion.py --url http://127.0.0.1:8080            # a running listener

With --bin it starts `warren up` in a temporary home with
`--sandbox-fusion`, imports the Debian+python3 test image (the one
tests/debian.py caches, or --image-tar), and stops it afterwards. As root.
"""

import argparse
import concurrent.futures
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CACHED_IMAGE = Path(os.environ.get("WARREN_TEST_CACHE", "/var/cache/warren-tests")) / "debian-bookworm-python3-oci.tar"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args):
    home = Path(tempfile.mkdtemp(prefix="warren-bench-fusion-"))
    api, fusion = free_port(), free_port()
    log = open(home / "up.log", "wb")
    proc = subprocess.Popen(
        [args.bin, "up", "--home", home / "home", "--listen", f"127.0.0.1:{api}",
         "--sandbox-fusion", f"127.0.0.1:{fusion}", "--sandbox-fusion-image", "bench-fusion:1"],
        stdout=log, stderr=log,
    )
    url = f"http://127.0.0.1:{fusion}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if httpx.get(url + "/v1/ping", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            sys.exit(f"warren up exited; see {home / 'up.log'}")
        time.sleep(0.1)
    env = {**os.environ, "WARREN_URL": f"http://127.0.0.1:{api}", "WARREN_HOME": str(home / "home")}
    subprocess.run([args.bin, "image", "import", args.image_tar, "--name", "bench-fusion:1"],
                   env=env, check=True, capture_output=True)
    return proc, home, url


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="the warren binary to start (else --url)")
    ap.add_argument("--url", help="a running SandboxFusion listener, e.g. http://127.0.0.1:8080")
    ap.add_argument("--image-tar", default=str(CACHED_IMAGE), help="OCI layout tar with python3 (with --bin)")
    ap.add_argument("-n", "--requests", type=int, default=640)
    ap.add_argument("-c", "--concurrency", type=int, default=64)
    ap.add_argument("--code", default="print(1)")
    args = ap.parse_args()
    if not (args.bin or args.url):
        ap.error("give --bin or --url")
    proc = home = None
    url = args.url
    if args.bin:
        proc, home, url = start(args)
    try:
        http = httpx.Client(timeout=300, limits=httpx.Limits(max_connections=args.concurrency))

        def one(_):
            t = time.perf_counter()
            r = http.post(url + "/run_code", json={"code": args.code})
            dt = time.perf_counter() - t
            ok = r.status_code == 200 and r.json().get("status") == "Success"
            return dt, ok, (None if ok else r.text[:300])

        # Warm-up: the image's first sandboxes, the page cache.
        for _ in range(3):
            one(0)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, range(args.requests)))
        wall = time.perf_counter() - t0
        lat = sorted(r[0] * 1000 for r in results)
        failed = [r[2] for r in results if not r[1]]
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
        print(f"/run_code {args.code!r}: {args.requests} requests, concurrency {args.concurrency}")
        print(f"  p50 {statistics.median(lat):.0f} ms  p90 {q(0.9):.0f} ms  p99 {q(0.99):.0f} ms  "
              f"{args.requests / wall:.1f} requests/s  failed {len(failed)}")
        for f in failed[:3]:
            print("  failure:", f)
        return 1 if failed else 0
    finally:
        if proc:
            proc.send_signal(2)
            proc.wait(timeout=60)
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
