"""`warren-bench floor`, the benchmark's floor probe (docs/benchmarks.md):
one sandbox's worth of kernel work with nothing of Warren around it. It
must really run the program in its namespaces and leave nothing behind on
the host, also when it fails."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import UP_ARGS, WARREN_BENCH

# The probe runs without a daemon: the suite's second pass (another node
# transport) would only run the same thing again.
pytestmark = pytest.mark.skipif(bool(UP_ARGS), reason="no daemon; run once")


def rootfs(tmp_path: Path, with_true: bool) -> Path:
    root = tmp_path / "rootfs"
    for d in ("bin", "proc"):
        (root / d).mkdir(parents=True)
    busybox = shutil.which("busybox") or "/bin/busybox"
    shutil.copy(busybox, root / "bin" / "busybox")
    if with_true:
        os.symlink("busybox", root / "bin" / "true")
    return root


def leftovers(pid: int) -> list[str]:
    """What a probe with this pid could have left: its cgroups and scratch
    directory (mounts stay in its own mount namespace)."""
    name = f"warren-floor-{pid}"
    cg = Path("/sys/fs/cgroup")
    found = [str(p) for p in (cg / name, cg / "cpu" / name, cg / "memory" / name, cg / "pids" / name) if p.exists()]
    scratch = Path("/tmp") / name
    return found + ([str(scratch)] if scratch.exists() else [])


def run_probe(root: Path):
    p = subprocess.Popen([str(WARREN_BENCH), "floor", "--rootfs", str(root)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    return p.pid, p.returncode, err


def test_the_floor_runs_true_in_its_namespaces_and_cleans_up(tmp_path):
    pid, code, err = run_probe(rootfs(tmp_path, with_true=True))
    assert code == 0, err
    assert leftovers(pid) == []
    # The image was not written to: the overlay's upper layer took any change.
    assert sorted(p.name for p in (tmp_path / "rootfs").iterdir()) == ["bin", "proc"]


def test_a_failing_floor_says_why_and_cleans_up(tmp_path):
    pid, code, err = run_probe(rootfs(tmp_path, with_true=False))
    assert code != 0
    assert "exec /bin/true" in err, err
    assert leftovers(pid) == []
