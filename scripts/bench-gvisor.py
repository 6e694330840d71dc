#!/usr/bin/env python3
"""The gvisor isolation class against the container class, and `runsc run`
alone, in one run on this machine (issue 45's cost table; docs/benchmarks.md,
"Isolation classes"). Prints Markdown.

Measures, per class, through Warren's HTTP API on a release build:
- create: POST /v1/sandboxes until it answers (the sandbox is ready);
- exec round trip of `true`;
- a syscall-heavy loop: `dd` copying 20,000 one-byte blocks (40,000
  read/write calls), as the exec's duration;
- a file write/read loop: 300 small files written by the shell and read back
  by one `cat`, in the sandbox's root;
- a Python import-heavy start: `python3 -c 'import ...'` of a dozen standard
  modules, in a Debian bookworm image with python3.
Beside them: `runsc run` of the same busybox root running /bin/true (what the
issue's target compares a gvisor create with) and `runc run` of it.

Usage: scripts/bench-gvisor.py [ITERATIONS]   (default 20; needs root, runsc,
runc, and the cached Debian image tests/debian.py builds)
"""

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
N = int(sys.argv[1]) if len(sys.argv) > 1 else 20
IMPORTS = "import json, email.parser, http.client, xml.etree.ElementTree, asyncio, decimal, urllib.request, sqlite3, csv, argparse, logging, unittest"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name, xs):
    return f"| {name} | {len(xs)} | {statistics.median(xs):.1f} | {pct(xs, 99):.1f} |"


def debian_python_archive():
    sys.path.insert(0, str(ROOT / "tests"))
    from debian import CACHE

    cached = CACHE / "debian-bookworm-python3-oci.tar"
    if not cached.exists():
        subprocess.run([ROOT / "scripts" / "make-base-image.sh", cached, "--include", "python3", "--tag", "deb"], check=True)
    return cached


def exec_ms(c, sid, cmd):
    """The exec's own duration (the daemon's measure), and its exit code."""
    code, took = None, None
    with c.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": cmd, "timeout": "300s"}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                ev = json.loads(line)
                if ev["type"] == "exit":
                    code, took = ev["code"], ev["duration_ms"]
    assert code == 0, (cmd, code)
    return took


def round_trip_ms(c, sid):
    t = time.perf_counter()
    with c.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"cmd": ["true"]}) as r:
        for _ in r.iter_lines():
            pass
    return (time.perf_counter() - t) * 1000


def busybox_bundle(work, runtime):
    """A bundle of busybox-static running /bin/true, from the runtime's own
    `spec` (so each gets the config it expects)."""
    bundle = work / f"bundle-{runtime}"
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    (rootfs / "bin" / "true").symlink_to("busybox")
    for d in ("proc", "dev", "sys", "tmp"):
        (rootfs / d).mkdir()
    subprocess.run([runtime, "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["args"] = ["/bin/true"]
    config["process"]["terminal"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def runtime_run_ms(work, runtime, extra):
    bundle = busybox_bundle(work, runtime)
    state = work / f"state-{runtime}"
    times = []
    for i in range(N):
        t = time.perf_counter()
        subprocess.run([runtime, f"--root={state}", *extra, "run", "--bundle", str(bundle), f"b{i}"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - t) * 1000)
    return times


def main():
    warren = ROOT / "target" / "release" / "warren"
    if not warren.exists():
        sys.exit("build it first: cargo build --release -p warren")
    work = Path(tempfile.mkdtemp(prefix="warren-bench-gvisor-"))
    home, port = work / "home", free_port()
    up = subprocess.Popen([warren, "up", "--home", home, "--listen", f"127.0.0.1:{port}", "--cgroup-parent", f"warren/{work.name}"],
                          stdout=subprocess.DEVNULL, stderr=open(work / "up.log", "wb"))
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(url + "/healthz", timeout=1).text.strip() == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        env = {**os.environ, "WARREN_URL": url, "WARREN_HOME": str(home)}
        subprocess.run([ROOT / "scripts" / "make-busybox-image.sh", work / "busybox.tar"], check=True, capture_output=True)
        subprocess.run([warren, "image", "import", work / "busybox.tar", "--name", "busybox:latest"], env=env, check=True, capture_output=True)
        subprocess.run([warren, "image", "import", debian_python_archive(), "--name", "deb:py"], env=env, check=True, capture_output=True)
        token = (home / "token").read_text().strip()
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300)
        results = {}
        for iso in ("container", "gvisor"):
            r = results[iso] = {"create": [], "exec": [], "syscalls": [], "files": [], "python": []}
            for _ in range(N):
                t = time.perf_counter()
                made = c.post("/v1/sandboxes", json={"image": "busybox:latest", "isolation": iso})
                r["create"].append((time.perf_counter() - t) * 1000)
                assert made.status_code == 201, made.text
                c.delete(f"/v1/sandboxes/{made.json()['id']}")
            sid = c.post("/v1/sandboxes", json={"image": "busybox:latest", "isolation": iso}).json()["id"]
            for _ in range(N):
                r["exec"].append(round_trip_ms(c, sid))
            for _ in range(max(3, N // 4)):
                r["syscalls"].append(exec_ms(c, sid, ["dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=20000"]))
                r["files"].append(exec_ms(c, sid, ["sh", "-c", "mkdir -p /d && cd /d && i=0; while [ $i -lt 300 ]; do echo $i > f$i; i=$((i+1)); done; cat f* > /dev/null; rm -r /d"]))
            c.delete(f"/v1/sandboxes/{sid}")
            py = c.post("/v1/sandboxes", json={"image": "deb:py", "isolation": iso}).json()["id"]
            for _ in range(max(3, N // 4)):
                r["python"].append(exec_ms(c, py, ["python3", "-c", IMPORTS]))
            c.delete(f"/v1/sandboxes/{py}")
        runsc = runtime_run_ms(work, "runsc", ["--network=none"])
        runc = runtime_run_ms(work, "runc", [])
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    runsc_p50 = statistics.median(runsc)
    print(f"### {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores, {os.uname().release}, release build, "
          f"{subprocess.run(['runsc', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")
    print()
    print("| measurement | n | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    names = {"create": "create (API, until ready)", "exec": "exec round trip of `true`", "syscalls": "syscall loop (dd, 40,000 calls)",
             "files": "file loop (300 files written, read back)", "python": "Python start importing 12 modules"}
    for key, name in names.items():
        for iso in ("container", "gvisor"):
            print(row(f"{name}: {iso}", results[iso][key]))
    print(row("`runsc run` of busybox /bin/true", runsc))
    print(row("`runc run` of busybox /bin/true", runc))
    print()
    print("| ratio (p50) | value |")
    print("|---|---:|")
    for key, name in names.items():
        g, k = statistics.median(results["gvisor"][key]), statistics.median(results["container"][key])
        print(f"| {name}: gvisor / container | {g / k:.2f}x |")
    g = statistics.median(results["gvisor"]["create"])
    print(f"| gvisor create / `runsc run` (target ≤ 1.5x) | {g / runsc_p50:.2f}x |")


if __name__ == "__main__":
    main()
