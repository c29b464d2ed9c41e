"""Free TCP ports for tests that start servers or rendezvous stores in other processes.

Importable from every test package (``from netutil import free_port``): pytest puts ``tests/`` on
``sys.path`` for the root ``conftest.py``.
"""

from __future__ import annotations

import socket


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports on ``host`` that were free a moment ago (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    return free_ports(1, host)[0]
