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

Every value on the board is sealed with the job key (job_key.py) and bound to the round's store
(its address and port) and to its kind, so a value someone else planted, or one copied from another
round or key, is ignored, counted (:attr:`StoreBoard.refusals`) and noted once; a planted claim or
refusal is replaced. The counters (heartbeats, the version, the count of waits) cannot be signed: a
forged bump can only delay a detection or cause an extra read, never admit, shrink or move a node.

What each board costs the store does not grow with the job while nothing fails: one read of a
version counter per poll (every write the others must see bumps it) and one heartbeat every 0.5 s.
The watched nodes' heartbeats are read only during an incident (a node's ranks wait for a
generation), every 0.5 s, and only by the spares and the first node.
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ..job_key import Opened, Refusals, Refused, Signer
from ..node_name import printable_name
from .board_records import Announcement, is_name

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
        signer: Signer,
    ) -> None:
        self._addr, self._port, self._timeout = addr, port, timedelta(seconds=timeout_s)
        self._note, self._node, self._clock = note, node, clock
        self._signer, self._round = signer, f"{addr}:{port}"
        self.refusals = Refusals(note)  # records that failed their seal: ignored, counted, noted once
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

    def _seal(self, kind: str, payload: bytes | str) -> bytes:
        """A record bound to this job's key, this round's store and its kind (job_key.py)."""
        return self._signer.seal(f"board/{kind}|{self._round}", payload)

    def _open(self, kind: str, raw: bytes, what: str) -> bytes | None:
        """The payload of a record read from the store; None (counted, noted once) unless signed."""
        match self._signer.open(f"board/{kind}|{self._round}", raw):
            case Opened(payload):
                return payload
            case Refused(reason):
                self.refusals.refused(what, reason)
                return None

    def _read(self, store: Any, key: str, kind: str, what: str) -> bytes | None:
        """The signed payload under ``key`` (None: absent, or not signed with this job's key)."""
        if not store.check([key]):
            return None
        return self._open(kind, store.get(key), what)

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
        raw = self._read(store, KEY, "announce", "an unsigned in-place announcement in the worker store")
        if raw is None:
            return
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
            store.set(KEY, self._seal("announce", a.encode()))
            self._take(a)
            bump = True
        if self._node and self._polls % BEAT_EVERY == 1:
            store.add(BEAT + self._node, 1)
        while self._node and not self._wait_out.empty():
            store.set(
                WAITING + self._node, self._seal("waiting/" + self._node, str(self._wait_out.get_nowait()))
            )
            store.add(WAITING_ANY, 1)
            if not self._incident and self._moved:
                self._watch_from_now()
            bump = True
        while not self._refuse_out.empty():  # the first node to refuse keeps the key
            why = self._refuse_out.get_nowait()
            doc = json.dumps({"node": self._node, "reason": why[:500]})
            self._claim_key(store, REFUSED, "refused", doc)
            bump = True
        while not self._claims_out.empty():
            lost = self._claims_out.get_nowait()
            holder = self._claim_key(store, CLAIM + lost, "claim/" + lost, self._node)
            self._claimed[lost] = holder.decode(errors="replace") if holder is not None else "?"
        while not self._group_out.empty():
            store.set(GROUP, self._seal("group", self._group_out.get_nowait().encode()))
            bump = True
        while not self._offer_out.empty():
            line = f"{self._offer_out.get_nowait()} {secrets.token_hex(8)}"  # a replayed line reads once
            store.append(OFFERS, self._seal("offer", line) + b"\n")
            bump = True
        while not self._invite_out.empty():
            a = self._invite_out.get_nowait()
            store.set(INVITE, self._seal("invite", a.encode()))
            self._invite = a
            bump = True
        while self._node and not self._ready_out.empty():
            store.set(
                READY + self._node, self._seal("ready/" + self._node, str(self._ready_out.get_nowait()))
            )
            bump = True
        if bump:
            store.add(VERSION, 1)

    def _claim_key(self, store: Any, key: str, kind: str, value: str) -> bytes | None:
        """Compare-and-set ``key`` from empty to our signed ``value``; the payload held there after
        (ours, or the signed one another node set first). An unsigned value someone planted is no
        claim: it is replaced once. None: still not signed (the planter raced us again)."""
        mine = self._seal(kind, value)
        held = store.compare_set(key, "", mine)
        for _ in range(2):
            raw = held if isinstance(held, bytes) else str(held).encode()
            payload = self._open(kind, raw, f"an unsigned {kind.partition('/')[0]} in the worker store")
            if payload is not None:
                return payload
            held = store.compare_set(key, raw, mine)
        return None

    def _read_refusal(self, store: Any) -> None:
        if self._refused is not None:
            return
        raw = self._read(store, REFUSED, "refused", "an unsigned refusal in the worker store")
        if raw is None:
            return
        try:
            doc = json.loads(raw.decode())
            self._refused = (printable_name(str(doc["node"])[:256]), printable_name(str(doc["reason"])[:500]))
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            self._refused = ("?", "a malformed refusal in the worker store")

    def _read_group(self, store: Any) -> None:
        """The group record and the offers (a malformed entry is ignored, never trusted)."""
        if (
            raw := self._read(store, GROUP, "group", "an unsigned group record in the worker store")
        ) is not None:
            try:
                self._group = Announcement.decode(raw)
            except ValueError as exc:
                self._note(f"ignored a malformed group record in the worker store: {exc}")
        if store.check([OFFERS]):
            self._read_offers(store.get(OFFERS))
        if (
            raw := self._read(store, INVITE, "invite", "an unsigned invitation in the worker store")
        ) is not None:
            try:
                self._invite = Announcement.decode(raw)
            except ValueError as exc:
                self._note(f"ignored a malformed invitation in the worker store: {exc}")
        for n in self._offers:
            raw = self._read(store, READY + n, "ready/" + n, "an unsigned readiness in the worker store")
            if raw is not None and raw.isdigit():
                self._ready[n] = int(raw)

    def _read_offers(self, raw: bytes) -> None:
        """The standing offers: each node's last signed line says whether its offer stands."""
        standing: dict[str, bool] = {}
        seq: dict[str, int] = {}
        seen: set[bytes] = set()
        for sealed in raw.splitlines():
            if sealed in seen:
                continue  # a signed line copied again (replayed) is one offer, not two
            seen.add(sealed)
            payload = self._open("offer", sealed, "an unsigned offer in the worker store")
            line = payload.decode(errors="replace").rpartition(" ")[0] if payload is not None else ""
            name = line[1:]
            if line[:1] in ("+", "-") and is_name(name) and name.isprintable():
                standing.pop(name, None)
                standing[name] = line[0] == "+"
                seq[name] = seq.get(name, 0) + (line[0] == "+")
        self._offers = tuple(n for n, up in standing.items() if up)
        self._offer_seq = seq

    def _read_nodes(self, store: Any) -> None:
        """The watched nodes' heartbeats (when each last moved) and which of them wait."""
        for n in list(self._moved):
            count = store.add(BEAT + n, 0)
            if count != self._beats.get(n):
                self._beats[n] = count
                if count:  # a node that never beat keeps its silence from the board's start
                    self._moved[n] = self._clock()
            raw = self._read(store, WAITING + n, "waiting/" + n, "an unsigned wait in the worker store")
            if raw is not None and raw.isdigit():
                self._waiting[n] = int(raw)

    def _take(self, a: Announcement) -> None:
        if self._seen is None or a.generation > self._seen.generation:
            self._seen = a
            self._incident = False  # the waits are answered: stop reading heartbeats
