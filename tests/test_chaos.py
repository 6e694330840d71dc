"""Fault injection: scripts/chaos.py runs ten rounds of a mixed workload with
`kill -9` of the daemon and one injected fault in some rounds (a spawner or
a sandbox's init killed, the store read-only, the disk full during an image
import, the daemon stopped for 30 s), restarts it each time and checks what
was acknowledged and what is left on the host. The seed is fixed, so every
run injects the same faults in the same rounds."""

import signal
import subprocess
import sys

import pytest

from conftest import ROOT, WARREN
from helpers import sigint_as_at_a_terminal

SEED = 20261130
TIMEOUT_S = 15 * 60


@pytest.mark.serial  # fills a disk, stops its daemon 30 s, bounds restarts and TTLs in seconds
def test_chaos_ten_rounds(tmp_path):
    report = tmp_path / "chaos.json"
    cmd = [
        sys.executable, str(ROOT / "scripts" / "chaos.py"),
        "--rounds", "10", "--seed", str(SEED), "--warren", str(WARREN), "--json", str(report),
    ]
    # Its own session, so that on a timeout it gets SIGINT and cleans up
    # (daemon, sandboxes, loop mount) before it is killed.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=sigint_as_at_a_terminal)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"chaos.py did not finish within {TIMEOUT_S}s; its output:\n{out[-30000:]}")
    assert proc.returncode == 0, f"chaos.py exited {proc.returncode}; its output:\n{out[-30000:]}"
