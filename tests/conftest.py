"""Integration-test harness: one `warren up` per test session, as root,
against the real kernel, with its own home and port."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from ports import free_port  # noqa: F401 (the tests import it from here)

ROOT = Path(__file__).resolve().parent.parent
# Cargo's build outputs: target/ in the tree, or where CARGO_TARGET_DIR says
# (scripts/test.sh puts them in a cache outside the clone in CI).
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
WARREN = Path(os.environ.get("WARREN_BIN", TARGET / "debug" / "warren"))
# The benchmarks and simulator, a binary of their own beside `warren`.
WARREN_BENCH = Path(os.environ.get("WARREN_BENCH_BIN", WARREN.parent / "warren-bench"))


def pytest_configure(config):
    # The markers scripts/test.sh selects by (docs/testing.md).
    for line in (
        "serial: owns the host (its clock, kernel-wide counters, its CPU or memory): runs alone, after the parallel part",
        "contract: drives a node-contract call end to end: runs again with the node over HTTP",
        "smoke: one quick test per front door and lifecycle step: scripts/test.sh --quick",
    ):
        config.addinivalue_line("markers", line)


# Flags every daemon of the run gets: the second pass of scripts/test.sh
# runs the suite with the control plane driving its node over HTTP.
UP_ARGS = os.environ.get("WARREN_TEST_UP_ARGS", "").split()


def stop_process(proc, sig=signal.SIGINT):
    """Signals a daemon and waits for it; killed if it takes over 30 s."""
    if proc and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


NO_SEARCH = "unqualified-search-registries = []\n"


def hermetic(home):
    """Gives a daemon's home a registries.toml that pulls short names from
    nowhere, unless it has one."""
    conf = home / "registries.toml"
    if not conf.exists():
        conf.write_text(NO_SEARCH)


class Warren:
    def __init__(self, home: Path, port: int, extra_args=(), extra_env=None, preexec=None):
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        self.preexec = preexec
        self.home = home
        self.port = port
        # A cgroup parent of its own (named for its unique directory), so
        # its sandboxes' cgroups, and every check of what is left of them,
        # are this daemon's alone beside the other daemons of the run.
        self.cgroup_parent = f"warren/{home.parent.name}"
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None
        self.log = None

    def start(self):
        # Short names are looked up on no registry unless a test says where
        # (the default, docker.io, is beyond this machine).
        self.home.mkdir(parents=True, exist_ok=True)
        hermetic(self.home)
        self.log = open(self.home.parent / f"warren-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [str(WARREN), "up", "--home", str(self.home), "--listen", f"127.0.0.1:{self.port}",
             "--cgroup-parent", self.cgroup_parent, *UP_ARGS, *self.extra_args],
            stdout=self.log,
            stderr=self.log,
            env={**os.environ, **self.extra_env},
            preexec_fn=self.preexec,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                # 200 as soon as it listens; "ok" once it has taken over
                # its sandboxes (the API waits for that anyway).
                r = httpx.get(self.url + "/healthz", timeout=1)
                if r.status_code == 200 and r.text.strip() == "ok":
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"warren up exited with {self.proc.returncode}")
            time.sleep(0.05)
        else:
            # Stopped, not left running: the caller has no handle to stop
            # it by (its `with` never began).
            stop_process(self.proc)
            raise RuntimeError(f"warren up did not become healthy within 20 s; log tail:\n{self.log_text()[-3000:]}")
        self.token = (self.home / "token").read_text().strip()
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        )

    def stop(self, sig=signal.SIGINT):
        stop_process(self.proc, sig)

    def leftovers(self):
        """What still runs in this daemon's cgroup parent once it has made
        a clean stop: a leak, each as (pid, cgroup, command line), with the
        lines of its log that name the sandboxes concerned."""
        found = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                # Each line is HIERARCHY:CONTROLLERS:PATH.
                paths = (line.split(":", 2)[-1] for line in (d / "cgroup").read_text().splitlines())
                cgroup = next((c for c in paths if (c + "/").startswith(f"/{self.cgroup_parent}/")), None)
                # A zombie runs nothing: the system's init reaps it.
                if cgroup is None or (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(d.name), cgroup, cmd))
        if not found:
            return ""
        sids = {c.rstrip("/").rsplit("/", 1)[-1] for _, c, _ in found}
        lines = [ln for ln in self.log_text().splitlines() if any(s in ln for s in sids)]
        return "\n".join([f"pid {p} in {c}: {cmd!r}" for p, c, cmd in found] + lines[-60:])

    def stop_clean(self):
        """A clean stop, which must leave nothing running in the daemon's
        cgroup parent (scripts/test.sh checks the whole run the same way,
        but cannot say which test leaked)."""
        self.stop()
        left = self.leftovers()
        assert not left, (
            f"left running after a stop of {self.home} (exit {self.proc.returncode}):\n{left}"
        )

    def log_text(self):
        """What the daemon wrote: its terminal output (warnings, its own
        lines) and its log file under the home (everything from info up)."""
        text = ""
        for p in (self.home.parent / f"warren-{self.port}.log", self.home / "warren-up.log"):
            with contextlib.suppress(FileNotFoundError):
                text += p.read_text(errors="replace")
        return text

    def stop_and_remove(self, base):
        """A clean stop that leaves nothing behind, then `base` (the
        daemon's directory) removed whatever the check found."""
        try:
            self.stop_clean()
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def finish(self, base):
        """The end of a daemon a fixture kept running: `stop_and_remove`;
        fails if the daemon died before."""
        crashed = self.proc.poll()
        if crashed is None:
            self.stop_and_remove(base)
            return
        log = self.log_text()[-4000:]
        shutil.rmtree(base, ignore_errors=True)
        raise AssertionError(f"warren up died (exit {crashed}); log tail:\n{log}")

    def env(self):
        return {**os.environ, "WARREN_URL": self.url, "WARREN_HOME": str(self.home)}

    def cli(self, *args, input=None, check=True, timeout=60):
        """Runs the warren CLI against this daemon; returns CompletedProcess (bytes)."""
        p = subprocess.run(
            [str(WARREN), *args], env=self.env(), input=input, capture_output=True, timeout=timeout
        )
        if check and p.returncode != 0:
            raise AssertionError(
                f"warren {' '.join(args)} failed ({p.returncode}): {p.stderr.decode(errors='replace')}"
            )
        return p

    def create(self, **spec):
        spec.setdefault("image", "busybox:latest")
        r = self.http.post("/v1/sandboxes", json=spec)
        assert r.status_code in (200, 201), r.text
        return r.json()

    def client(self):
        """A fresh authenticated httpx client (for use from another thread)."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        )

    def exec(self, sid, cmd, client=None, **kw):
        """POST exec; returns (exit_event, stdout bytes, stderr bytes, all events).
        On a non-200 answer returns (response, None, None, None); when the stream
        ends without an exit event, exit_event is None."""
        import base64

        body = {"cmd": cmd, **kw}
        out, err, events = b"", b"", []
        http = client or self.http
        with http.stream("POST", f"/v1/sandboxes/{sid}/exec", json=body) as r:
            if r.status_code != 200:
                r.read()
                return r, None, None, None
            for line in r.iter_lines():
                if not line:
                    continue
                ev = json.loads(line)
                events.append(ev)
                if ev["type"] == "stdout":
                    out += base64.b64decode(ev["data"])
                elif ev["type"] == "stderr":
                    err += base64.b64decode(ev["data"])
        exit_ev = next((e for e in events if e["type"] == "exit"), None)
        return exit_ev, out, err, events

    def destroy(self, sid):
        return self.http.delete(f"/v1/sandboxes/{sid}")


@contextlib.contextmanager
def own_daemon(images, args=(), env=None, preexec=None, under=None):
    """A `warren up` of a test's own (to crash, restart or configure), with
    busybox:latest imported; stopped and removed afterwards. `under`: the
    directory its home is made in (a file system of the test's own)."""
    base = Path(tempfile.mkdtemp(prefix="warren-own-", dir=under))
    w = Warren(base / "home", free_port(), extra_args=args, extra_env=env, preexec=preexec)
    w.home.mkdir()
    w.start()
    try:
        w.cli("image", "import", str(images["oci"]), "--name", "busybox:latest")
        yield w
    finally:
        if w.proc.poll() is not None:
            # A test that crashed the daemon and failed before restarting
            # it: a start takes its sandboxes over, and the stop removes them.
            w.extra_env = {}
            with contextlib.suppress(Exception):
                w.start()
        w.stop_and_remove(base)


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    oci = d / "busybox-oci.tar"
    subprocess.run([str(ROOT / "scripts" / "make-busybox-image.sh"), str(oci)], check=True, capture_output=True)
    docker = d / "busybox-docker.tar"
    subprocess.run(
        ["skopeo", "copy", "-q", f"oci-archive:{oci}:latest", f"docker-archive:{docker}:busybox:docker"],
        check=True,
        capture_output=True,
    )
    return {"oci": oci, "docker": docker, "dir": d}


@pytest.fixture(scope="session")
def warren(images):
    base = Path(tempfile.mkdtemp(prefix="warren-test-"))
    w = Warren(base / "home", free_port())
    w.home.mkdir()
    w.start()
    w.cli("image", "import", str(images["oci"]), "--name", "busybox:latest")
    yield w
    w.finish(base)


@pytest.fixture
def sandbox(warren):
    """A fresh running sandbox, destroyed afterwards."""
    created = []

    def make(**spec):
        info = warren.create(**spec)
        created.append(info["id"])
        return info

    yield make
    for sid in created:
        warren.destroy(sid)


@pytest.fixture(scope="session")
def postgres():
    """A throw-away PostgreSQL server for the session (tests/pg.py); removed
    at the end, whatever happened."""
    from pg import TempPostgres

    with TempPostgres() as pg:
        yield pg


@pytest.fixture
def pg_database(postgres):
    """The URL of a fresh, empty database on the session's server, dropped
    after the test."""
    url = postgres.create_database()
    yield url
    postgres.drop_database(url)
