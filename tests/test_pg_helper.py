"""The throw-away PostgreSQL helper (tests/pg.py, scripts/pg-temp.sh) that
the store and cluster tests stand on: it serves, it isolates, and it leaves
nothing behind, also when the test using it fails."""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import UP_ARGS
from pg import PG_TEMP, TempPostgres

# No daemon here: the suite's second pass (another node transport) would
# only run the same thing again.
pytestmark = pytest.mark.skipif(bool(UP_ARGS), reason="no daemon; run once")


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes.
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def test_serves_on_its_own_socket_and_is_removed():
    with TempPostgres() as pg:
        d = pg.dir
        pid = postmaster_pid(d / "data")
        assert pg.url.startswith("postgres://postgres@%2Ftmp%2Fwarren-pg-"), pg.url
        assert pg.psql("SELECT 1") == "1"
        # Unix socket only: no TCP listener of its own.
        assert pg.psql("SHOW listen_addresses") == ""
        assert (d / ".s.PGSQL.5432").is_socket()
        a, b = pg.create_database(), pg.create_database()
        pg.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (1)", url=a)
        assert pg.psql("SELECT count(*) FROM t", url=a) == "1"
        with pytest.raises(RuntimeError, match="does not exist"):
            pg.psql("SELECT count(*) FROM t", url=b)
        pg.drop_database(a)
        assert a.rsplit("=", 1)[1] not in pg.psql("SELECT datname FROM pg_database")
    assert not d.exists()
    assert not alive(pid)


def test_tcp_on_loopback():
    with TempPostgres(tcp=True) as pg:
        assert pg.url.startswith("postgres://postgres@127.0.0.1:"), pg.url
        assert pg.psql("SHOW listen_addresses") == "127.0.0.1"
        assert pg.psql("SELECT 1") == "1"


def test_removed_when_the_test_fails():
    pg = TempPostgres()
    with pytest.raises(ZeroDivisionError):
        with pg:
            d, pid = pg.dir, postmaster_pid(pg.dir / "data")
            1 / 0
    assert not d.exists()
    assert not alive(pid)


def test_stop_after_the_server_died_and_start_refuses_a_used_dir(tmp_path):
    with TempPostgres() as pg:
        d, pid = pg.dir, postmaster_pid(pg.dir / "data")
        # Not empty: refused, and the running server is left alone.
        p = subprocess.run([str(PG_TEMP), "start", str(d)], capture_output=True, text=True)
        assert p.returncode != 0 and "not empty" in p.stderr
        assert pg.psql("SELECT 1") == "1"
        os.kill(pid, 9)
    assert not d.exists()


def test_fixture(pg_database, postgres):
    assert postgres.psql("SELECT current_database()", url=pg_database) == pg_database.rsplit("=", 1)[1]
