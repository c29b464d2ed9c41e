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

A lost node's agent is gone with it, so nobody replaces its ranks from inside. For that case the board
also carries (policy/inplace.py :func:`~stalwart.policy.inplace.take_over`):

* a heartbeat per active agent (a counter each board thread bumps every 0.5 s); a hot spare's board
  (and the first node's) watches the active nodes' counters and measures, on its own clock, how long
  each has not moved;
* which nodes' ranks wait for a generation nobody announced (the survivors of a lost peer);
* a claim per lost node (compare-and-set), so that two spares never take the same node's place;
* once the group shrank or grew in place, its nodes and size (the first node writes them), and the
  offers of nodes that arrive while the job runs: the first node invites them to start their ranks
  in the next generation, and once each newcomer said its ranks are ready, announces that generation
  (policy/inplace.py :func:`~stalwart.policy.inplace.grow`).

What each board costs the store does not grow with the job while nothing fails: one read of a
version counter per poll (every write the others must see bumps it) and one heartbeat every 0.5 s.
The watched nodes' heartbeats are read only during an incident (a node's ranks wait for a
generation), every 0.5 s, and only by the spares and the first node.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeGuard

KEY = "stalwart/inplace/announce"
REFUSED = "stalwart/inplace/refused"
VERSION = "stalwart/inplace/version"  # bumped by every write the others must read
WAITING_ANY = "stalwart/inplace/waiting-any"
BEAT = "stalwart/inplace/beat/"
WAITING = "stalwart/inplace/waiting/"
CLAIM = "stalwart/inplace/claim/"
GROUP = "stalwart/inplace/group"  # the group's nodes and size since it last shrank or grew in place
INVITE = "stalwart/inplace/invite"  # the place the first node gives newcomers (their generation to start in)
READY = "stalwart/inplace/ready/"  # a newcomer's ranks are about to join that generation
OFFERS = "stalwart/inplace/offers"  # "+node" (offers a free place) or "-node" (withdrew), one a line
POLL_S = 0.1
BEAT_EVERY = 5  # polls between two heartbeats (0.5 s)
WATCH_EVERY = 5  # polls between two reads of the watched nodes' heartbeats, during an incident


@dataclass(frozen=True)
class Announcement:
    generation: int  # the generation every rank re-forms into
    node: str  # the node whose agent replaced its failed ranks (or decided the shrink)
    ranks: tuple[int, ...]  # the ranks replaced
    # a group that shrank in place (a lost node, no hot spare): the new world size and the surviving
    # nodes in their new group-rank order; 0 and () when every node keeps its place
    world_size: int = 0
    active: tuple[str, ...] = ()

    def encode(self) -> bytes:
        doc: dict[str, object] = {"generation": self.generation, "node": self.node, "ranks": list(self.ranks)}
        if self.world_size:
            doc.update(world_size=self.world_size, active=list(self.active))
        return json.dumps(doc).encode()

    def place(self, node: str, nproc_per_node: int) -> tuple[int, int] | None:
        """(first global rank, world size) of ``node`` in the shrunk group; None when the group did not
        shrink or ``node`` is not in it."""
        if not self.world_size or node not in self.active:
            return None
        return self.active.index(node) * nproc_per_node, self.world_size

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
        if not _count(gen):
            raise ValueError(f"generation {gen!r} is not a positive integer")
        if not _name(node):
            raise ValueError("node is not a name")
        if not isinstance(ranks, list) or not all(_count(r) or r == 0 for r in ranks):
            raise ValueError("ranks is not a list of ranks")
        world, active = doc.get("world_size", 0), doc.get("active", [])
        if world == 0 and active == []:
            return Announcement(gen, node, tuple(ranks))
        if not _count(world):
            raise ValueError(f"world_size {world!r} is not a positive integer")
        if not isinstance(active, list) or not active or not all(_name(n) for n in active):
            raise ValueError("active is not a list of node names")
        if len(set(active)) != len(active) or node not in active:
            raise ValueError("active repeats a node or lacks the announcing node")
        if world % len(active):
            raise ValueError(f"world_size {world} is not a multiple of {len(active)} nodes")
        return Announcement(gen, node, tuple(ranks), world, tuple(active))


def _count(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _name(v: object) -> TypeGuard[str]:
    return isinstance(v, str) and 0 < len(v) <= 256


class Board(Protocol):
    """The port the in-place recovery uses to tell other nodes, and to hear from them."""

    def announce(self, a: Announcement) -> None:
        """Hand an announcement over; never waits on the network."""
        ...

    def latest(self) -> Announcement | None:
        """The newest announcement seen (ours included); never waits."""
        ...

    def close(self) -> None: ...

    def waiting(self, generation: int) -> None:
        """Say that this node's ranks wait for ``generation`` (a lost peer nobody announced)."""
        ...

    def refuse(self, reason: str) -> None:
        """Say that this node's failure is not recovered in place (the others stop waiting)."""
        ...

    def refusal(self) -> tuple[str, str] | None:
        """(node, reason) of the first node that said so, once read; never waits."""
        ...

    def silence(self) -> dict[str, float]:
        """Seconds since each watched node's heartbeat last moved."""
        ...

    def publish_group(self, a: Announcement) -> None:
        """Record the group's nodes and size after it shrank or grew in place; never waits."""
        ...

    def offers(self) -> tuple[str, ...]:
        """Nodes that arrived during the job and offer a free place, in order; never waits."""
        ...

    def offer_seq(self, node: str) -> int:
        """How many times ``node`` offered; never waits."""
        ...

    def watch_more(self, nodes: Sequence[str]) -> None:
        """Watch the heartbeats of ``nodes`` too."""
        ...

    def invite(self, a: Announcement) -> None:
        """Give newcomers their places in ``a.generation``; never waits."""
        ...

    def ready(self, generation: int) -> None:
        """Say that this node's ranks are about to join ``generation``; never waits."""
        ...

    def ready_nodes(self) -> dict[str, int]:
        """Offered nodes whose ranks are ready, and the generation; never waits."""
        ...


class StoreBoard:
    """A :class:`Board` over the round's worker store, with every call on one daemon thread."""

    def __init__(
        self,
        addr: str,
        port: int,
        timeout_s: float,
        note: Callable[[str], None] = lambda text: None,
        *,
        node: str = "",
        watch: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._addr, self._port, self._timeout = addr, port, timedelta(seconds=timeout_s)
        self._note, self._node, self._clock = note, node, clock
        self._out: queue.Queue[Announcement] = queue.Queue()
        self._stop = threading.Event()
        self._seen: Announcement | None = None
        self._bad = b""
        # a spare's view of the active nodes: the last counter read, and when it last moved
        start = clock()
        self._beats: dict[str, int] = {}
        self._moved: dict[str, float] = dict.fromkeys(watch, start)
        self._waiting: dict[str, int] = {}  # node -> the generation its ranks wait for
        self._wait_out: queue.Queue[int] = queue.Queue()
        self._claims_out: queue.Queue[str] = queue.Queue()
        self._claimed: dict[str, str] = {}  # lost node -> the spare that holds its claim
        self._refuse_out: queue.Queue[str] = queue.Queue()
        self._refused: tuple[str, str] | None = None
        self._polls = 0
        self._answered = False  # one poll completed (what was in the store then is read)
        self._group_out: queue.Queue[Announcement] = queue.Queue()
        self._group: Announcement | None = None
        self._offer_out: queue.Queue[str] = queue.Queue()  # "+node" offers, "-node" withdraws
        self._offers: tuple[str, ...] = ()
        self._offer_seq: dict[str, int] = {}  # node -> how many times it offered (a new offer counts up)
        self._invite_out: queue.Queue[Announcement] = queue.Queue()
        self._invite: Announcement | None = None
        self._ready_out: queue.Queue[int] = queue.Queue()
        self._ready: dict[str, int] = {}  # offered node -> the generation its ranks are ready to join
        self._version = -1  # the first poll reads whatever is already there
        self._incident = False  # some node's ranks wait: read the watched nodes' heartbeats
        self._waits = 0  # the waits counted so far (a new one starts an incident)
        self._thread = threading.Thread(target=self._loop, name="stalwart-inplace-board", daemon=True)
        self._thread.start()

    def announce(self, a: Announcement) -> None:
        self._out.put(a)

    def latest(self) -> Announcement | None:
        return self._seen

    def close(self) -> None:
        self._stop.set()  # the thread leaves at its next poll; a call stuck on a dead host is a daemon

    def waiting(self, generation: int) -> None:
        self._wait_out.put(generation)

    def refuse(self, reason: str) -> None:
        self._refuse_out.put(reason)

    def refusal(self) -> tuple[str, str] | None:
        return self._refused

    def silence(self) -> dict[str, float]:
        """Seconds since each watched node's heartbeat last moved (on this board's clock), counted from
        the start of the incident at the earliest; empty outside an incident (nothing is read then)."""
        if not self._incident:
            return {}
        now = self._clock()
        return {n: now - t for n, t in dict(self._moved).items()}

    def nodes_waiting(self) -> dict[str, int]:
        """Nodes whose ranks wait for a generation nobody announced yet, and that generation (a wait
        an announcement answered is over: it never makes a later silence look like a lost node)."""
        seen = self._seen.generation if self._seen is not None else 0
        return {n: g for n, g in dict(self._waiting).items() if g > seen}

    @property
    def answered(self) -> bool:
        """Whether one poll completed: :meth:`group` and :meth:`latest` hold what the store had then."""
        return self._answered

    def publish_group(self, a: Announcement) -> None:
        """Record the group's nodes and size after it shrank or grew in place (for arriving nodes)."""
        self._group_out.put(a)

    def group(self) -> Announcement | None:
        """The group's nodes and size as its first node last recorded them (None: never resized)."""
        return self._group

    def offer(self, node: str) -> None:
        """Offer ``node`` (arrived during the job) for a free place in the group."""
        self._offer_out.put("+" + node)

    def withdraw(self, node: str) -> None:
        """``node`` gave up waiting for a place (it joins the rendezvous instead)."""
        self._offer_out.put("-" + node)

    def offers(self) -> tuple[str, ...]:
        """The nodes that offered a free place, in the order they offered."""
        return self._offers

    def offer_seq(self, node: str) -> int:
        """How many times ``node`` offered (a node that starts again offers anew)."""
        return self._offer_seq.get(node, 0)

    def watch_more(self, nodes: Sequence[str]) -> None:
        """Watch the heartbeats of ``nodes`` too (newcomers the group took in), from now."""
        now = self._clock()
        for n in nodes:
            self._moved[n] = now
            self._beats.pop(n, None)

    def invite(self, a: Announcement) -> None:
        """Give the newcomers of ``a`` their places: they start their ranks in ``a.generation``."""
        self._invite_out.put(a)

    def invited(self) -> Announcement | None:
        """The latest invitation the first node wrote (None: none)."""
        return self._invite

    def ready(self, generation: int) -> None:
        """Say that this node's ranks are about to join ``generation`` (a newcomer's)."""
        self._ready_out.put(generation)

    def ready_nodes(self) -> dict[str, int]:
        """Offered nodes whose ranks are ready, and the generation they are ready to join."""
        return dict(self._ready)

    def claim(self, lost: str) -> None:
        """Ask to take ``lost``'s place (the answer comes through :meth:`claimed_by`)."""
        self._claims_out.put(lost)

    def claimed_by(self, lost: str) -> str | None:
        """The node holding the claim on ``lost``'s place, once the store answered."""
        return self._claimed.get(lost)

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
        """One poll: write what was handed over; read what the others wrote when the version moved."""
        self._polls += 1
        self._write(store)
        version = store.add(VERSION, 0)
        if version != self._version:
            self._version = version
            self._read_refusal(store)
            self._read_announcement(store)
            self._read_group(store)
            waits = store.add(WAITING_ANY, 0)
            if waits > self._waits and self._moved and not self._incident:  # a new wait: an incident
                self._watch_from_now()
            self._waits = waits
        if self._incident and self._polls % WATCH_EVERY == 1:
            self._read_nodes(store)
        self._answered = True

    def _watch_from_now(self) -> None:
        """Start reading the watched heartbeats; their silence counts from now, not from before."""
        now = self._clock()
        self._moved = dict.fromkeys(self._moved, now)
        self._beats = {}
        self._incident = True

    def _read_announcement(self, store: Any) -> None:
        if not store.check([KEY]):
            return
        raw = store.get(KEY)
        try:
            self._take(Announcement.decode(raw))
        except ValueError as exc:
            if raw != self._bad:
                self._bad = raw
                self._note(f"ignored a malformed in-place announcement in the worker store: {exc}")

    def _write(self, store: Any) -> None:
        bump = False
        while not self._out.empty():
            a = self._out.get_nowait()
            store.set(KEY, a.encode())
            self._take(a)
            bump = True
        if self._node and self._polls % BEAT_EVERY == 1:
            store.add(BEAT + self._node, 1)
        while self._node and not self._wait_out.empty():
            store.set(WAITING + self._node, str(self._wait_out.get_nowait()))
            store.add(WAITING_ANY, 1)
            if not self._incident and self._moved:
                self._watch_from_now()
            bump = True
        while not self._refuse_out.empty():  # the first node to refuse keeps the key
            why = self._refuse_out.get_nowait()
            store.compare_set(REFUSED, "", json.dumps({"node": self._node, "reason": why[:500]}))
            bump = True
        while not self._claims_out.empty():
            lost = self._claims_out.get_nowait()
            holder = store.compare_set(CLAIM + lost, "", self._node)
            self._claimed[lost] = (
                holder.decode(errors="replace") if isinstance(holder, bytes) else str(holder)
            )
        while not self._group_out.empty():
            store.set(GROUP, self._group_out.get_nowait().encode())
            bump = True
        while not self._offer_out.empty():
            store.append(OFFERS, self._offer_out.get_nowait() + "\n")
            bump = True
        while not self._invite_out.empty():
            a = self._invite_out.get_nowait()
            store.set(INVITE, a.encode())
            self._invite = a
            bump = True
        while self._node and not self._ready_out.empty():
            store.set(READY + self._node, str(self._ready_out.get_nowait()))
            bump = True
        if bump:
            store.add(VERSION, 1)

    def _read_refusal(self, store: Any) -> None:
        if self._refused is not None or not store.check([REFUSED]):
            return
        try:
            doc = json.loads(store.get(REFUSED).decode())
            self._refused = (str(doc["node"])[:256], str(doc["reason"])[:500])
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            self._refused = ("?", "a malformed refusal in the worker store")

    def _read_group(self, store: Any) -> None:
        """The group record and the offers (a malformed entry is ignored, never trusted)."""
        if store.check([GROUP]):
            try:
                self._group = Announcement.decode(store.get(GROUP))
            except ValueError as exc:
                self._note(f"ignored a malformed group record in the worker store: {exc}")
        if store.check([OFFERS]):
            standing: dict[str, bool] = {}  # a node's last line says whether its offer stands
            seq: dict[str, int] = {}
            for line in store.get(OFFERS).decode(errors="replace").splitlines():
                name = line[1:]
                if line[:1] in ("+", "-") and _name(name) and name.isprintable():
                    standing.pop(name, None)
                    standing[name] = line[0] == "+"
                    seq[name] = seq.get(name, 0) + (line[0] == "+")
            self._offers = tuple(n for n, up in standing.items() if up)
            self._offer_seq = seq
        if store.check([INVITE]):
            try:
                self._invite = Announcement.decode(store.get(INVITE))
            except ValueError as exc:
                self._note(f"ignored a malformed invitation in the worker store: {exc}")
        for n in self._offers:
            if store.check([READY + n]):
                raw = store.get(READY + n)
                if raw.isdigit():
                    self._ready[n] = int(raw)

    def _read_nodes(self, store: Any) -> None:
        """The watched nodes' heartbeats (when each last moved) and which of them wait."""
        for n in list(self._moved):
            count = store.add(BEAT + n, 0)
            if count != self._beats.get(n):
                self._beats[n] = count
                if count:  # a node that never beat keeps its silence from the board's start
                    self._moved[n] = self._clock()
            if store.check([WAITING + n]):
                raw = store.get(WAITING + n)
                if raw.isdigit():
                    self._waiting[n] = int(raw)

    def _take(self, a: Announcement) -> None:
        if self._seen is None or a.generation > self._seen.generation:
            self._seen = a
            self._incident = False  # the waits are answered: stop reading heartbeats
