"""The suite's downloads (Debian userlands, client SDKs from PyPI and npm),
made once and cached under WARREN_TEST_CACHE between runs.

Two suites run at once (scripts/test.sh) and a prefetch beside the build
(`python3 tests/caches.py`): a cache entry is made under a lock, so one
process makes it and the others wait for it and use it.

    python3 tests/caches.py    # make every entry the suite needs now
"""

import contextlib
import fcntl
import os
import sys
from pathlib import Path

CACHE = Path(os.environ.get("WARREN_TEST_CACHE", "/var/cache/warren-tests"))


@contextlib.contextmanager
def making(name):
    """Held while the cache entry `name` is checked and, if missing, made."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name.replace('/', '_')}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prefetch():
    """Makes every entry the suite uses: the tests that need them then start
    at once instead of downloading first."""
    sys.path.insert(0, str(Path(__file__).parent))
    import tempfile

    from debian import debian_archive
    from test_e2b import INTERPRETER, VERSIONS, npm_e2b, venv
    from test_fusion import FUSION_PACKAGES, fusion_clients

    with tempfile.TemporaryDirectory(prefix="warren-test-cache-") as tmp:
        for packages in (("python3",), FUSION_PACKAGES):
            d = Path(tmp) / "-".join(packages)
            d.mkdir()
            debian_archive(d, packages)
    for version in VERSIONS:
        venv(version)
    venv(None, INTERPRETER)
    npm_e2b()
    fusion_clients()


if __name__ == "__main__":
    prefetch()
