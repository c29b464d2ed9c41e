"""torch's dynamic rendezvous with its state authenticated and its store bound to the job's address.

torch's ``DynamicRendezvousHandler`` keeps the rendezvous state as a pickle in its backend (the c10d
store's ``torch.rendezvous.<run id>`` key, or etcd) and unpickles whatever it reads there: anyone who
can write that key runs code in every agent. :class:`SealedBackend` wraps any backend: what torch
writes is sealed with the job key (job_key.py), and what it reads is handed to torch only when the
seal holds and the state is not older than one this agent already saw (a replayed state). A state that
fails is never unpickled: a read hands torch the last authentic state (or none) with the token of what
is stored, and a write replaces the planted bytes by compare-and-set on that token; the refusal is
counted and noted once.

A lost compare-and-set backs off: torch retries a lost write at once with the state it got back, so N
agents joining together make about N^2/2 attempts of which all but N lose, and at 64 agents on one
host the storm kept participants from beating within torch's keep-alive expiry (3 keep-alive
intervals), so they were dropped and joined again without end (bench/rdzv_scale.py). Here a loss waits
a random time within a window that doubles with each loss in a row (from BACKOFF_S up to
BACKOFF_CAP_S, reset by a write that holds), then reads the state afresh for torch, so its next attempt
starts from the newest state rather than from one already stale.

The c10d store: torch's backend opens its TCPStore itself, listening on every interface. Here the
hosting agent binds the endpoint's own address (a local name resolves to it; loopback stays
loopback) and hands the socket to the store (``master_listen_fd``); an agent whose address is not the
endpoint's, or whose port another local agent already holds, is a client, as in torch.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import random
import socket
import struct
import time
from collections.abc import Callable

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from ...errors import ConfigError
from ...job_key import Opened, Refusals, Refused, Signer

DEFAULT_PORT = 29400
_SEQ = struct.Struct(">Q")
BACKOFF_S = 0.005  # the first lost compare-and-set waits up to this long; each further loss doubles it
BACKOFF_CAP_S = 0.5  # ... up to this (bounded well inside torch's keep-alive and close deadlines)


class SealedBackend(RendezvousBackend):
    """A :class:`RendezvousBackend` whose state is sealed with the job key and sequenced."""

    def __init__(
        self,
        inner: RendezvousBackend,
        signer: Signer,
        refusals: Refusals,
        sleep: Callable[[float], None] = time.sleep,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.inner, self.signer, self.refusals = inner, signer, refusals
        self.seen = 0  # the newest sequence number read or written (an older one is a replay)
        self.last: bytes | None = None  # the newest authentic state torch holds
        self.losses = 0  # compare-and-sets lost in a row (the backoff window doubles with each)
        self._sleep, self._draw = sleep, draw
        self._context = "rendezvous-state"

    @property
    def name(self) -> str:
        return self.inner.name

    def _open(self, stored: bytes) -> bytes | None:
        """torch's state bytes from what is stored; None when it is not this job's (counted, noted)."""
        match self.signer.open(self._context, stored):
            case Opened(body) if len(body) >= _SEQ.size:
                (seq,) = _SEQ.unpack_from(body)
                if seq < self.seen:
                    self.refusals.refused("a replayed rendezvous state", f"sequence {seq} after {self.seen}")
                    return None
                self.seen, self.last = seq, body[_SEQ.size :]
                return self.last
            case Opened(_):
                self.refusals.refused("a rendezvous state", "too short to hold a sequence number")
            case Refused(reason):
                self.refusals.refused("a rendezvous state not signed with this job's key", reason)
        return None

    def get_state(self) -> tuple[bytes, Token] | None:
        """What is stored, once authentic. Planted bytes are never handed to torch: it gets the last
        authentic state (or none) with the stored token, so its next compare-and-set replaces them."""
        got = self.inner.get_state()
        if got is None:
            return None
        stored, token = got
        state = self._open(stored)
        if state is None:
            return None if self.last is None else (self.last, token)
        return state, token

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """torch's compare-and-set, sealed. Where planted bytes hold the key, they are replaced once by
        a compare-and-set on their own token (they are no one's state). torch never gets bytes it did
        not write or read authentic: on a second loss it gets the last authentic state, or nothing."""
        for _ in range(2):
            seq = self.seen + 1
            got = self.inner.set_state(self.signer.seal(self._context, _SEQ.pack(seq) + state), token)
            if got is None:
                return None
            stored, token, written = got
            if written:
                self.seen, self.last, self.losses = seq, state, 0
                return state, token, True
            current = self._open(stored)
            if current is not None:
                return self._back_off(current, token)
        return None if self.last is None else (self.last, token, False)

    def _back_off(self, current: bytes, token: Token) -> tuple[bytes, Token, bool]:
        """After a lost compare-and-set: wait a random time within the window, then hand torch the
        state as it is now (read as get_state reads it: authentic, or the newest authentic one with
        the token of what is stored) for its next attempt."""
        self.losses += 1
        window = min(BACKOFF_CAP_S, BACKOFF_S * 2 ** min(self.losses - 1, 30))
        self._sleep(window * self._draw())
        fresh = self.get_state()
        if fresh is None:
            return current, token, False
        return fresh[0], fresh[1], False


def _loopback_trap(host: str, infos: list) -> bool:
    """A host name (not a loopback literal) that resolves only to loopback here: Debian's ``127.0.1.1``
    line in /etc/hosts. The other nodes resolve it to the machine's real address."""
    literal = host in ("localhost", "::1") or host.startswith("127.")
    return not literal and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _bind(host: str, port: int, note: Callable[[str], None]) -> socket.socket | None:
    """A listening socket on ``host:port`` (its resolved address), or None when that address is not
    this machine's or another process holds the port (this agent is then a client)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    if infos and _loopback_trap(host, infos):
        try:
            sock = socket.create_server(("", port), backlog=1024)
        except OSError:
            return None
        note(
            f"{host} resolves to a loopback address on this host (/etc/hosts), so the rendezvous store "
            "listens on every interface; give --rdzv-endpoint this host's cluster address to bind only it"
        )
        return sock
    for family, _, _, _, addr in infos:
        try:
            return socket.create_server(addr[:2], family=family, backlog=1024)
        except OSError:
            continue
    return None


def c10d_store(
    endpoint: str,
    is_host: bool | None,
    timeout_s: float,
    note: Callable[[str], None] = lambda text: None,
    hosted: Callable[[], None] = lambda: None,
) -> TCPStore:
    """The c10d rendezvous store: hosted here on the endpoint's own address when this machine has that
    address and the port is free (or ``is_host`` says so; ``hosted`` is called then), else a client of
    the agent that hosts it."""
    host, port = parse_rendezvous_endpoint(endpoint, default_port=DEFAULT_PORT)
    timeout = datetime.timedelta(seconds=timeout_s)
    sock = _bind(host, port, note) if is_host is not False else None
    if sock is None and is_host:
        raise ConfigError(
            f"cannot host the rendezvous store at {host}:{port}: the address is not this machine's or "
            "the port is taken",
            "free the port, or give --rdzv-endpoint an address of this host (or --no-rdzv-host)",
        )
    if sock is None:
        return TCPStore(host, port, None, False, timeout=timeout, wait_for_workers=False)
    bound = sock.getsockname()[0]
    here = "127.0.0.1" if bound in ("0.0.0.0", "::") else bound  # the store's own client connects here
    fd = sock.detach()
    try:
        store = TCPStore(here, port, None, True, timeout=timeout, wait_for_workers=False, master_listen_fd=fd)
    except Exception:
        os.close(fd)
        raise
    hosted()
    return store


__all__ = ["SealedBackend", "c10d_store"]
