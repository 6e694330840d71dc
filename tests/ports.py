"""Ports for the daemons and servers the tests start.

A port found free by binding port 0 comes from the kernel's ephemeral range,
and between that check and the daemon's own bind any outbound connection on
the machine may be given it as its local port (the suite opens thousands):
the daemon then fails with "Address already in use". So each test process
takes its ports from a block of its own below the ephemeral range, where
the kernel gives no outbound connection a port, one block per xdist worker,
in turn, skipping any port something already holds.
"""

import itertools
import os
import socket
from pathlib import Path

BLOCK = 1000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    top = _ephemeral_low() - n * BLOCK
    return range(top - BLOCK, top)


_turns = itertools.cycle(_block())


def free_port() -> int:
    """A port of this process's block that nothing holds now; never the same
    twice in a row of BLOCK calls."""
    for _ in range(BLOCK):
        port = next(_turns)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_block()}")
