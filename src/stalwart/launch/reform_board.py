"""In-place re-formation across nodes: how one node's agent tells the others (docs/fast-recovery.md).

Each agent supervises only its own node's ranks. When one of them fails and its agent re-forms the
group in place (policy/inplace.py), the other nodes' ranks see their peer vanish and wait for a new
generation; their agents must learn which one. The replacing agent writes an :class:`Announcement`
under one key of the round's worker store (the TCPStore every rank of the round already uses, fresh
for every attempt); every agent reads that key.

No store call runs on the supervisor's thread: :class:`StoreBoard` owns one daemon thread that makes
every call with the store timeout as its deadline, writes the announcements handed to it and polls the
key; the tick reads the latest value it saw and never waits. A value that is not a well-formed
announcement (another program writing the key) is ignored with a note, never trusted.
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

KEY = "stalwart/inplace/announce"
POLL_S = 0.1


@dataclass(frozen=True)
class Announcement:
    generation: int  # the generation every rank re-forms into
    node: str  # the node whose agent replaced its failed ranks
    ranks: tuple[int, ...]  # the ranks replaced

    def encode(self) -> bytes:
        return json.dumps(
            {"generation": self.generation, "node": self.node, "ranks": list(self.ranks)}
        ).encode()

    @staticmethod
    def decode(raw: bytes) -> Announcement:
        """Parse a stored announcement; ValueError names what is wrong with it."""
        try:
            doc = json.loads(raw.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        gen, node, ranks = doc.get("generation"), doc.get("node"), doc.get("ranks")
        if not isinstance(gen, int) or isinstance(gen, bool) or gen <= 0:
            raise ValueError(f"generation {gen!r} is not a positive integer")
        if not isinstance(node, str) or not node or len(node) > 256:
            raise ValueError("node is not a name")
        if not isinstance(ranks, list) or not all(isinstance(r, int) and r >= 0 for r in ranks):
            raise ValueError("ranks is not a list of ranks")
        return Announcement(gen, node, tuple(ranks))


class Board(Protocol):
    """The port the in-place recovery uses to tell other nodes, and to hear from them."""

    def announce(self, a: Announcement) -> None:
        """Hand an announcement over; never waits on the network."""
        ...

    def latest(self) -> Announcement | None:
        """The newest announcement seen (ours included); never waits."""
        ...

    def close(self) -> None: ...


class StoreBoard:
    """A :class:`Board` over the round's worker store, with every call on one daemon thread."""

    def __init__(self, addr: str, port: int, timeout_s: float, note=lambda text: None) -> None:
        self._addr, self._port, self._timeout = addr, port, timedelta(seconds=timeout_s)
        self._note = note
        self._out: queue.Queue[Announcement] = queue.Queue()
        self._stop = threading.Event()
        self._seen: Announcement | None = None
        self._bad = b""
        self._thread = threading.Thread(target=self._loop, name="stalwart-inplace-board", daemon=True)
        self._thread.start()

    def announce(self, a: Announcement) -> None:
        self._out.put(a)

    def latest(self) -> Announcement | None:
        return self._seen

    def close(self) -> None:
        self._stop.set()  # the thread leaves at its next poll; a call stuck on a dead host is a daemon

    def _loop(self) -> None:
        store: Any = None
        while not self._stop.is_set():
            try:
                if store is None:
                    from torch.distributed import TCPStore

                    store = TCPStore(
                        self._addr, self._port, None, False, timeout=self._timeout, wait_for_workers=False
                    )
                self._exchange(store)
            except Exception:  # noqa: BLE001 - the store is unreachable: try again on a new connection
                store = None
            self._stop.wait(POLL_S)

    def _exchange(self, store: Any) -> None:
        while True:
            try:
                a = self._out.get_nowait()
            except queue.Empty:
                break
            store.set(KEY, a.encode())
            self._take(a)
        if store.check([KEY]):
            raw = store.get(KEY)
            try:
                self._take(Announcement.decode(raw))
            except ValueError as exc:
                if raw != self._bad:
                    self._bad = raw
                    self._note(f"ignored a malformed in-place announcement in the worker store: {exc}")

    def _take(self, a: Announcement) -> None:
        if self._seen is None or a.generation > self._seen.generation:
            self._seen = a
