"""The c10d rendezvous store listens on the endpoint's own address (torch's backend listens on every
interface), and an agent whose port another agent holds is a client of it."""

from __future__ import annotations

import socket

import pytest

from netutil import free_port
from stalwart.errors import ConfigError
from stalwart.launch.rendezvous.sealed import c10d_store

pytestmark = pytest.mark.integration


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


def test_the_store_listens_on_the_endpoints_address_only_and_a_second_agent_is_a_client():
    port = free_port()
    served: list[str] = []  # which agent was told it serves the store (its exit would end the job)
    host = c10d_store(f"127.0.0.1:{port}", None, 10.0, hosted=lambda: served.append("host"))
    assert _accepts("127.0.0.1", port)
    assert not _accepts("127.0.0.2", port)  # torch's own backend would answer on every address
    # the port is held: this agent is a client
    client = c10d_store(f"127.0.0.1:{port}", None, 10.0, hosted=lambda: served.append("client"))
    client.set("k", "v")
    assert host.get("k") == b"v" and served == ["host"]


def test_hosting_on_an_address_that_is_not_this_machines_is_one_clear_error():
    with pytest.raises(ConfigError, match="cannot host the rendezvous store"):
        c10d_store(f"192.0.2.1:{free_port()}", True, 1.0)  # TEST-NET-1: never this host's; nothing is sent


def test_a_host_name_that_resolves_to_loopback_listens_everywhere_and_says_so(monkeypatch):
    port = free_port()
    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *a, **kw: real("127.0.1.1" if host == "headnode" else host, *a, **kw),
    )
    notes: list[str] = []
    store = c10d_store(f"headnode:{port}", True, 10.0, notes.append)
    try:
        assert _accepts("127.0.0.2", port) and "listens on every interface" in notes[0]
    finally:
        del store
