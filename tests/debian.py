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


def debian_archive(tmp_path, packages=("python3",)):
    """An OCI archive (tag `deb`) of a Debian bookworm userland with
    `packages`, built with mmdebstrap once and cached between runs; its
    path (for `warren image import`)."""
    name = "-".join(p.replace("+", "p") for p in packages)
    cached = CACHE / f"debian-bookworm-{name}-oci.tar"
    if cached.exists():
        return cached
    if not shutil.which("mmdebstrap"):
        pytest.skip("mmdebstrap is not installed (scripts/install-deps.sh --test)")
    with cache_lock(cached.name):
        if not cached.exists():
            build_debian(tmp_path, packages, name, cached)
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


def build_debian(tmp_path, packages, name, cached):
    """Builds the archive at `cached` with mmdebstrap and umoci."""
    work = tmp_path / f"build-{name}"
    work.mkdir()
    rootfs = work / "rootfs.tar"
    # No device nodes: images may not carry them (Warren's own /dev is used).
    run("mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(packages)}", "--mode=root",
        "--skip=output/dev", "bookworm", rootfs)
    layout = work / "oci"
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", f"{layout}:deb")
    run("umoci", "unpack", "--image", f"{layout}:deb", work / "bundle")
    run("tar", "-C", work / "bundle" / "rootfs", "-xf", rootfs)
    run("umoci", "repack", "--image", f"{layout}:deb", work / "bundle")
    partial = cached.with_suffix(".partial")
    run("tar", "-C", layout, "-cf", partial, ".")
    partial.rename(cached)


def debian_python_layout(tmp_path):
    """The python3 archive unpacked as an OCI layout directory."""
    cached = debian_archive(tmp_path)
    layout = tmp_path / "debian-oci"
    layout.mkdir()
    run("tar", "-C", layout, "-xf", cached)
    return layout
