#!/usr/bin/env python3
"""The E2B SDK's cycle on Warren beside Warren's own SDK, in one run:
`Sandbox.create()` + `commands.run("true")` + `kill()` through the real
`e2b` package (2.63.0) against the same cycle through `warren.Client`
(create + exec `true` + destroy), same image, same daemon, in alternating
blocks so that drift hits both alike.

    python3 scripts/bench-e2b.py [--cycles 50] [--blocks 4] [--warren target/release/warren]

Starts its own `warren up` (temporary home, E2B listeners on loopback),
imports the cached Debian image the tests build (tests/debian.py), and
prints one JSON line: p50/p90 per cycle and cycles/s for each client.
Needs a venv with e2b and the Warren SDK; it makes one under
/var/cache/warren-tests/venvs/bench-e2b on first use.
"""

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("WARREN_TEST_CACHE", "/var/cache/warren-tests"))
VENV = CACHE / "venvs" / "bench-e2b"
IMAGE = "e2b-deb:1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_venv():
    py = VENV / "bin" / "python"
    if not (VENV / "complete").exists():
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([VENV / "bin" / "pip", "install", "-q", "e2b==2.63.0", str(ROOT / "sdk" / "python")],
                       check=True)
        (VENV / "complete").write_text("ok")
    return py


def measure(args):
    """Runs inside the venv: the two cycles, alternating."""
    import warren
    from e2b import Sandbox

    client = warren.Client(os.environ["WARREN_URL"], token=os.environ["WARREN_TOKEN"])

    def e2b_cycle():
        sbx = Sandbox.create("base")
        assert sbx.commands.run("true").exit_code == 0
        sbx.kill()

    def warren_cycle():
        sb = client.sandboxes.create(IMAGE, keep_alive=False)
        assert sb.exec(["true"]).exit_code == 0
        sb.destroy()

    times = {"e2b": [], "warren": []}
    for f in (e2b_cycle, warren_cycle):  # warm both paths once
        f()
    for block in range(args.blocks * 2):
        name, f = ("e2b", e2b_cycle) if block % 2 == 0 else ("warren", warren_cycle)
        for _ in range(args.cycles):
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    out = {"cycles_each": args.cycles * args.blocks}
    for name, ts in times.items():
        qs = statistics.quantiles(ts, n=10)
        out[f"{name}_p50_ms"] = round(statistics.median(ts) * 1000, 1)
        out[f"{name}_p90_ms"] = round(qs[8] * 1000, 1)
        out[f"{name}_cycles_per_s"] = round(len(ts) / sum(ts), 1)
    out["e2b_over_warren"] = round(out["e2b_p50_ms"] / out["warren_p50_ms"], 2)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--warren", default=str(ROOT / "target" / "release" / "warren"))
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return measure(args)
    sys.path.insert(0, str(ROOT / "tests"))
    from debian import debian_python_layout  # builds the cached image archive

    base = Path(tempfile.mkdtemp(prefix="warren-bench-e2b-"))
    home = base / "home"
    home.mkdir()
    (home / "e2b-templates.toml").write_text(f'[templates]\nbase = "{IMAGE}"\n')
    port, api, sbx = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(base / "warren.log", "wb")
    proc = subprocess.Popen([args.warren, "up", "--home", home, "--listen", f"127.0.0.1:{port}",
                             "--e2b-api", f"127.0.0.1:{api}", "--e2b-sandbox", f"127.0.0.1:{sbx}"],
                            stdout=log, stderr=log)
    try:
        for _ in range(200):
            if (home / "token").exists():
                break
            time.sleep(0.05)
        time.sleep(0.5)
        debian_python_layout(base)
        env = {**os.environ, "WARREN_URL": url, "WARREN_HOME": str(home)}
        subprocess.run([args.warren, "image", "import", CACHE / "debian-bookworm-python3-oci.tar", "--name", IMAGE],
                       env=env, check=True, capture_output=True)
        token = (home / "token").read_text().strip()
        env.update({"WARREN_TOKEN": token, "E2B_API_URL": f"http://127.0.0.1:{api}",
                    "E2B_SANDBOX_URL": f"http://127.0.0.1:{sbx}", "E2B_API_KEY": "e2b_" + token})
        subprocess.run([ensure_venv(), __file__, "--inner", "--cycles", str(args.cycles),
                        "--blocks", str(args.blocks)], env=env, check=True)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
