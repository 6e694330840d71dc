"""Throw-away PostgreSQL servers for the integration tests.

A thin layer over scripts/pg-temp.sh (which the Rust tests' runner uses too):
the server lives in a directory of its own under /tmp, listens on a unix
socket there (or 127.0.0.1 with tcp=True), and is stopped and its directory
removed when the `with` block ends, also when the test in it fails.

    from pg import TempPostgres

    with TempPostgres() as pg:
        url = pg.create_database()          # a fresh, empty database
        server = Warren(..., ["--database", url])

Fixtures (tests/conftest.py): `postgres`, one server for the whole session,
and `pg_database`, a fresh database on it for each test.
"""

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PG_TEMP = ROOT / "scripts" / "pg-temp.sh"


class TempPostgres:
    def __init__(self, tcp=False, options=""):
        self.tcp = tcp
        # Extra server settings ("-c name=value ..."), see pg-temp.sh.
        self.options = options
        self.dir = None
        self.url = None

    def start(self):
        # Directly under /tmp: every parent is searchable by `postgres`.
        self.dir = Path(tempfile.mkdtemp(prefix="warren-pg-", dir="/tmp"))
        args = [str(PG_TEMP), "start", str(self.dir)] + (["--tcp"] if self.tcp else [])
        try:
            p = subprocess.run(
                args,
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "PG_TEMP_OPTS": self.options, **self.port_env()},
            )
            if p.returncode != 0:
                raise RuntimeError(f"pg-temp.sh start failed ({p.returncode}): {p.stderr}")
            self.url = p.stdout.strip()
        except BaseException:
            self.stop()
            raise
        return self

    def port_env(self):
        # The port from the tests' own blocks (see ports.py), not one the
        # script finds free in the ephemeral range.
        if not self.tcp:
            return {}
        return {"PG_TEMP_PORT": str(free_port())}

    def stop(self):
        if self.dir is None:
            return
        subprocess.run([str(PG_TEMP), "stop", str(self.dir)], capture_output=True, timeout=120)
        # pg-temp.sh removes it; if even that failed, nothing is left behind.
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def psql(self, sql, url=None):
        """Runs SQL as the superuser; returns its output (unaligned, tuples only)."""
        p = subprocess.run(
            ["psql", url or self.url, "-v", "ON_ERROR_STOP=1", "-tAc", sql],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if p.returncode != 0:
            raise RuntimeError(f"psql {sql!r} failed: {p.stderr}")
        return p.stdout.strip()

    def create_database(self, name=None):
        """A new empty database; returns its URL."""
        name = name or f"warren_{secrets.token_hex(6)}"
        self.psql(f'CREATE DATABASE "{name}"')
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}dbname={name}"

    def drop_database(self, url):
        name = url.rsplit("dbname=", 1)[1]
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

