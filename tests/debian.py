"""A Debian bookworm userland with bash and python3 as an OCI layout: the
image for tests that need a real distribution (the registry tests, the E2B
and SandboxFusion front doors). Built once with mmdebstrap and cached."""

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

import pytest

from helpers import run

CACHE = Path(os.environ.get("WARREN_TEST_CACHE", "/var/cache/warren-tests"))
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make-base-image.sh"


def debian_archive(tmp_path, packages=("python3",), e2b_user=False):
    """An OCI archive (tag `deb`) of a Debian bookworm userland with
    `packages` (and, with `e2b_user`, E2B's `base`: bash, git, sudo and the
    user `user`), built by scripts/make-base-image.sh once and cached
    between runs; its path (for `warren image import`)."""
    name = "-".join(p.replace("+", "p") for p in packages) + ("-e2b" if e2b_user else "")
    cached = CACHE / f"debian-bookworm-{name}-oci.tar"
    if cached.exists():
        return cached
    if not shutil.which("mmdebstrap"):
        pytest.skip("mmdebstrap is not installed (scripts/install-deps.sh --test)")
    with cache_lock(cached.name):
        if not cached.exists():
            args = ["--include", ",".join(packages), "--tag", "deb"] + (["--e2b-user"] if e2b_user else [])
            run(SCRIPT, cached, *args)
    return cached


@contextlib.contextmanager
def cache_lock(name):
    """Holds the lock of the cache entry `name` (a file beside it): of the
    parallel test workers that need an entry at once, one makes it and the
    others wait for it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def debian_python_layout(tmp_path):
    """The python3 archive unpacked as an OCI layout directory."""
    cached = debian_archive(tmp_path)
    layout = tmp_path / "debian-oci"
    layout.mkdir()
    run("tar", "-C", layout, "-xf", cached)
    return layout
