#!/usr/bin/env python3
"""Runs one create+run(`true`)+destroy cycle benchmark for Warren, runc,
bubblewrap and podman in the same run, on the same busybox-static image, and
prints a Markdown table with ratios to Warren. Used by scripts/bench.sh."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))]


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return (time.perf_counter() - t) * 1000


def measure(make_cmd, n, conc):
    # Warm-up.
    for i in range(3):
        timed(make_cmd(f"w{i}"))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        lat = list(pool.map(lambda i: timed(make_cmd(f"c{conc}-{i}")), range(n)))
    wall = time.perf_counter() - t0
    return {"p50_ms": statistics.median(lat), "p99_ms": pct(lat, 99), "per_sec": n / wall}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warren-json", required=True, help="output of `warren-bench lifecycle --json`")
    ap.add_argument("--image-tar", required=True, help="OCI layout tar of the busybox image")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--warren-bin", help="also time `warren run --rm -- true` through the CLI (WARREN_URL set)")
    ap.add_argument("--bench-bin", help="also time `warren-bench floor`, the kernel work alone (as root)")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    work = Path(tempfile.mkdtemp(prefix="warren-bench-"))
    try:
        layout = work / "oci"
        layout.mkdir()
        subprocess.run(["tar", "-C", str(layout), "-xf", args.image_tar], check=True)
        bundle = work / "bundle"
        subprocess.run(["umoci", "unpack", "--image", f"{layout}:latest", str(bundle)], check=True, stdout=subprocess.DEVNULL)
        cfg = json.loads((bundle / "config.json").read_text())
        cfg["process"]["args"] = ["/bin/true"]
        cfg["process"]["terminal"] = False
        # This host withholds CAP_SYS_RESOURCE: keep rlimits at what we have.
        cfg["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
        (bundle / "config.json").write_text(json.dumps(cfg))
        rootfs = bundle / "rootfs"

        runtimes = {}
        if args.warren_bin:
            # The whole CLI process: start, one POST /v1/run, output, exit.
            runtimes["warren run --rm (CLI)"] = lambda i: [
                args.warren_bin, "run", "--rm", "--image", "busybox:latest", "--", "true",
            ]
        if args.bench_bin and os.geteuid() == 0:
            # The least kernel work for the same isolation, one process
            # per cycle like runc (crates/warren-runtime/src/floor.rs).
            runtimes["floor (kernel work only)"] = lambda i: [
                args.bench_bin, "floor", "--rootfs", str(rootfs),
            ]
        if shutil.which("runc"):
            runtimes["runc run"] = lambda i: ["runc", "run", "--bundle", str(bundle), f"bench-{os.getpid()}-{i}"]
        if shutil.which("bwrap"):
            runtimes["bwrap"] = lambda i: [
                "bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", str(rootfs), "/",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "/bin/true",
            ]
        podman = ["podman", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        if shutil.which("podman"):
            docker_tar = work / "docker.tar"
            subprocess.run(["skopeo", "copy", "-q", f"oci-archive:{args.image_tar}:latest", f"docker-archive:{docker_tar}:warren-bench/busybox:latest"], check=True)
            subprocess.run(podman + ["load", "-q", "-i", str(docker_tar)], check=True, stdout=subprocess.DEVNULL)
            runtimes["podman run --rm"] = lambda i: podman + [
                "run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024",
                "--ulimit", "nproc=4096:4096", "docker.io/warren-bench/busybox:latest", "true",
            ]

        warren = {r["name"]: r for r in json.loads(Path(args.warren_json).read_text())}
        rows = []
        for conc in levels:
            w = warren.get(f"cycle_c{conc}")
            if w:
                rows.append(("warren (API: create+exec+destroy)", conc, w))
            for name, make in runtimes.items():
                try:
                    rows.append((name, conc, measure(make, args.iterations, conc)))
                except subprocess.CalledProcessError as e:
                    print(f"{name}: failed: {e.stderr.decode(errors='replace')[:300]}", file=sys.stderr)

        print("| runtime | concurrency | p50 ms | p99 ms | cycles/s | p50 vs warren | cycles/s vs warren |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, conc, r in rows:
            w = warren.get(f"cycle_c{conc}")
            ratio_lat = r["p50_ms"] / w["p50_ms"] if w else float("nan")
            ratio_tput = r["per_sec"] / w["per_sec"] if w else float("nan")
            print(f"| {name} | {conc} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['per_sec']:.1f} | {ratio_lat:.2f}x | {ratio_tput:.2f}x |")
        print()
        print("| warren measurement | n | p50 ms | p99 ms |")
        print("|---|---:|---:|---:|")
        for key in ("create_to_ready", "exec_true_round_trip", "destroy"):
            if key in warren:
                r = warren[key]
                print(f"| {key} | {r['n']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
        floor = next((r for name, conc, r in rows if name.startswith("floor") and conc == 1), None)
        if floor and "create_to_ready" in warren:
            create = warren["create_to_ready"]["p50_ms"]
            print()
            print(f"Create p50 {create:.2f} ms against the floor's whole cycle p50 {floor['p50_ms']:.2f} ms "
                  f"(its process start, namespaces, cgroups, overlay, /bin/true and teardown): {create / floor['p50_ms']:.2f}x.")
        phases = warren.get("create_phases")
        if phases and phases.get("phases"):
            # Mean per create; node_*/runtime_* phases run inside node_create.
            print()
            print("| create phase | mean ms |")
            print("|---|---:|")
            for name, ms in phases["phases"].items():
                print(f"| {name.removesuffix('_ms')} | {ms:.3f} |")
        idle = warren.get("idle_sandboxes")
        if idle:
            print()
            print(f"Idle density: {idle['n']} idle sandboxes created in {idle['create_all_s']:.2f} s; "
                  f"daemon RSS {idle['daemon_rss_before_mib']:.1f} MiB -> {idle['daemon_rss_after_mib']:.1f} MiB "
                  f"(+{idle['daemon_rss_growth_mib']:.1f} MiB); every one answered an exec afterwards.")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if shutil.which("podman"):
            subprocess.run(podman + ["rmi", "-f", "docker.io/warren-bench/busybox:latest"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
