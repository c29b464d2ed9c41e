"""In-place re-formation across nodes: how one node's agent tells the others (docs/fast-recovery.md).

Each agent supervises only its own node's ranks. When one of them fails and its agent re-forms the
group in place (policy/inplace.py), the other nodes' ranks see their peer vanish and wait for a new
generation; their agents must learn which one. The agents share one board in the round's worker store
(the TCPStore every rank of the round already uses, fresh for every attempt): one versioned document
(launch/inplace/board_state.py: the announcement, the group record, the invitation, offers, readiness, waits,
the refusal and the claims), sealed as one record with the job key and bound to the round's store,
and written only by compare-and-set on the bytes its writer last read, as torch elastic writes its
rendezvous state. A change is data (:class:`~stalwart.launch.inplace.board_state.Change`); a writer that lost
the race applies it again to what it found.

No store call runs on the supervisor's thread: each :class:`StoreBoard` polls on its :class:`Ticker`
(by default a daemon thread at least every :data:`POLL_S`, and at once when a change is handed over or
another board nudges: launch/inplace/ticker.py; tests tick a :class:`ManualTicker` by hand), makes
every call with the store timeout as its deadline, writes the changes handed to it and reads the
document when it moved; the tick reads what the board last saw and never waits.

A lost node's agent is gone with it, so nobody replaces its ranks from inside. For that case the board
also carries (policy/inplace.py :func:`~stalwart.policy.inplace.take_over`):

* a heartbeat per active agent: a counter under its own key, bumped every 0.5 s (one ``add``). The
  heartbeats stay out of the document on purpose: a shared document would turn every beat of every
  node into a compare-and-set that races all the others. A hot spare's board (and the first node's)
  reads the watched nodes' counters during an incident and measures, on its injected clock, how long
  each has not moved;
* which nodes' ranks wait for a generation nobody announced (the survivors of a lost peer);
* a claim per lost node (the first claim stands), so that two spares never take the same place;
* once the group shrank or grew in place, its nodes and size (the first node writes them), and the
  offers of nodes that arrive while the job runs: the first node invites them to start their ranks
  in the next generation, and once each newcomer said its ranks are ready, announces that generation
  (policy/inplace.py :func:`~stalwart.policy.inplace.grow`).

A document that is not signed with the job key for this round, is malformed, or is older than one
this board already read (replayed) is ignored, counted (:attr:`StoreBoard.refusals`) and noted once;
the next write replaces it by a compare-and-set on its bytes, built on the last authentic state this
board read (a planted claim or refusal is thus replaced). The counters (heartbeats, the version)
cannot be signed: a forged bump can only delay a detection or cause an extra read, never admit,
shrink or move a node.

What each board costs the store does not grow with the job while nothing fails: one read of the
version counter per poll (every write of the document bumps it after its compare-and-set) and one
heartbeat every 0.5 s. The document is read only when the version moved, and the watched nodes'
heartbeats only during an incident, every 0.5 s, and only by the spares and the first node.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

from ...health.link_counters import read_heard
from ...job_key import Opened, Refusals, Signer
from .board_records import Announcement, GroupRecord, InvitationRecord
from .board_state import (
    Announce,
    BoardState,
    Change,
    Claim,
    Invite,
    Offer,
    PublishGroup,
    Ready,
    Refuse,
    Unsound,
    Wait,
    Withdraw,
    open_state,
    seal,
    write,
)
from .liveness import LIVE, Line, Watch
from .ticker import POLL_S, ManualTicker, ThreadTicker, Ticker, Waker

KEY = "stalwart/inplace/board"  # the one sealed, versioned document
VERSION = "stalwart/inplace/version"  # bumped after every write of the document
BEAT = "stalwart/inplace/beat/"  # a heartbeat counter per node
BEAT_EVERY = 5  # polls between two heartbeats (0.5 s)
WATCH_EVERY = 5  # polls between two reads of the watched nodes' heartbeats, during an incident
CAS_TRIES = 8  # compare-and-set attempts per poll before the changes wait for the next one
HEARD_AFTER_S = 1.0  # a line quiet this long (two beats missed) outside an incident: ask the kernel
HEARD_EVERY_S = 0.25  # at most this often
HEARD_FRESH_S = 1.0  # a kernel reading older than this is no reading (no verdict outside an incident)


class StoreBoard:
    """A :class:`~stalwart.launch.inplace.board_records.Board` over the round's worker store, every call on
    its ticker's thread."""

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
        ticker: Ticker | None = None,
        live_host: str = "",
        heard: Callable[[Collection[str]], Mapping[str, float] | None] = read_heard,
    ) -> None:
        self._addr, self._port, self._timeout = addr, port, timedelta(seconds=timeout_s)
        self._note, self._node, self._clock = note, node, clock
        self._signer, self._where = signer, f"{addr}:{port}"
        self.refusals = Refusals(note)  # documents that failed: ignored, counted, noted once per kind
        self._changes: deque[Change] = deque()  # handed over, not yet written
        self._stop = threading.Event()
        self._store: Any = None  # Any: torch's Store, imported lazily (heavy)
        self._state = BoardState()  # the last authentic state read or written
        self._raw = b""  # the bytes last read or written under KEY (the next compare-and-set's base)
        self._seen: Announcement | None = None  # the newest announcement seen
        # a spare's view of the active nodes: the last counter read, and when it last moved
        self._beats: dict[str, int] = {}
        self._moved: dict[str, float] = dict.fromkeys(watch, clock())
        self._polls = 0  # exchanges with the store
        self._ticks = 0  # polls, answered or not (the liveness line beats on these)
        self._answered = False  # one poll completed (what was in the store then is read)
        self._version = -1  # the first poll reads whatever is already there
        self._incident = False  # some node's ranks wait: read the watched nodes' heartbeats
        # the kernel's word on the watched agents' processes (liveness.py): this agent's own line,
        # published once, and connections to the watched nodes' lines
        self._line = Line(live_host) if live_host and node else None
        self._line_published = False
        self._line_lock = threading.Lock()  # closed by the owner's thread, served by the poll thread
        self._watch = Watch(clock)
        # outside an incident, when this host's kernel last heard from the quiet lines' hosts
        self._read_heard = heard
        # when that was read (this board's clock; older than fresh is no reading), and node -> when its
        # host was last heard: one tuple, swapped whole (the supervisor's thread reads it)
        self._heard: tuple[float, dict[str, float]] = (-HEARD_FRESH_S - 1.0, {})
        self._heard_asked = self._heard[0]
        self._waker = Waker()  # the owner's thread hands a change over: the poll thread writes it now
        (ticker or ThreadTicker()).start(self.poll, self._stop, self._idle)

    # --- the Board port: hand over, never wait --------------------------------------------------

    def _hand(self, change: Change) -> None:
        self._changes.append(change)
        self._waker.wake()

    def announce(self, a: Announcement) -> None:
        self._hand(Announce(a))

    def latest(self) -> Announcement | None:
        return self._seen

    def close(self, leaving: bool = False) -> None:
        self._stop.set()  # the ticker stops polling this board; a call stuck on a dead host is a daemon
        self._waker.wake()  # a poll thread waiting between polls sees the stop now
        with self._line_lock:
            if self._line is not None:
                self._line.close(leaving)  # a goodbye, or: this agent leaves the job that goes on
                self._line = None
            self._watch.close()
        self._waker.close()  # a poll thread waiting on it wakes (or finds it closed) and stops

    def dead(self) -> dict[str, float]:
        """Watched nodes whose agent process is gone (their liveness connection ended without a
        goodbye) or that left the job on purpose (:meth:`left`), and the seconds since that was seen:
        no heartbeat bound to wait out."""
        now = self._clock()
        gone = {**self._watch.dead(), **self._watch.left()}
        return {n: now - t for n, t in gone.items() if n in self._moved}

    def left(self) -> frozenset[str]:
        """The nodes of :meth:`dead` whose agent said it leaves the job (it excluded its own node)."""
        return frozenset(n for n in self._watch.left() if n in self._moved)

    def waiting(self, generation: int) -> None:
        if self._node:
            self._hand(Wait(self._node, generation))

    def refuse(self, reason: str) -> None:
        self._hand(Refuse(self._node, reason))

    def refusal(self) -> tuple[str, str] | None:
        return self._state.refusal

    def silence(self) -> dict[str, float]:
        """Seconds since each watched node was last heard from. During an incident (some node's ranks
        wait): its heartbeat in the store, counted from the incident's start at the earliest, or its
        liveness line's beats (liveness.py) when they are more recent. Outside an incident a line's
        quiet alone is no verdict (a saturated slow link delays its beats past the bound:
        tests/e2e/test_hosts_link.py): it counts only as far as this host's kernel has taken no
        segment at all from that node's host, on any connection (:meth:`_check_heard`), read fresh."""
        with self._line_lock:
            quiet = {n: q for n, q in self._watch.quiet().items() if n in self._moved}
        now = self._clock()
        if not self._incident:
            read, heard = self._heard
            if now - read > HEARD_FRESH_S:
                return {}
            return {n: min(q, now - heard[n]) for n, q in quiet.items() if n in heard}
        stored = {n: now - t for n, t in dict(self._moved).items()}
        return {n: min(s, quiet.get(n, s)) for n, s in stored.items()}

    def nodes_waiting(self) -> dict[str, int]:
        """Watched nodes whose ranks wait for a generation nobody announced yet, and that generation (a
        wait an announcement answered is over: it never makes a later silence look like a lost node)."""
        seen = self._seen.generation if self._seen is not None else 0
        return {n: g for n, g in self._state.waiting.items() if g > seen and n in self._moved}

    @property
    def answered(self) -> bool:
        """Whether one poll completed: :meth:`group` and :meth:`latest` hold what the store had then."""
        return self._answered

    def publish_group(self, a: Announcement) -> None:
        """Record the group's nodes and size after it shrank or grew in place (for arriving nodes)."""
        if a.world_size:
            self._hand(PublishGroup(GroupRecord.of(a)))

    def group(self) -> Announcement | None:
        """The group's nodes and size as its first node last recorded them (None: never resized)."""
        g = self._state.group
        return g.as_announcement() if g is not None else None

    def offer(self, node: str) -> None:
        """Offer ``node`` (arrived during the job) for a free place in the group."""
        self._hand(Offer(node))

    def withdraw(self, node: str) -> None:
        """``node`` gave up waiting for a place (it joins the rendezvous instead)."""
        self._hand(Withdraw(node))

    def offers(self) -> tuple[str, ...]:
        """The nodes that offered a free place, in the order of their last offers."""
        return tuple(o.node for o in self._state.offers if o.standing)

    def offer_seq(self, node: str) -> int:
        """How many times ``node`` offered (a node that starts again offers anew)."""
        return next((o.seq for o in self._state.offers if o.node == node), 0)

    def watch_more(self, nodes: Sequence[str]) -> None:
        """Watch the heartbeats of ``nodes`` too (newcomers the group took in), from now: a node taken
        back runs a new agent, so what its old line said (dead, left) is forgotten and its new line
        dialled."""
        now = self._clock()
        for n in nodes:
            self._moved[n] = now
            self._beats.pop(n, None)
            with self._line_lock:
                self._watch.forget(n)

    def invite(self, a: Announcement) -> None:
        """Give the newcomers of ``a`` their places: they start their ranks in ``a.generation``."""
        if a.world_size:
            self._hand(Invite(InvitationRecord.of(a)))

    def invited(self) -> Announcement | None:
        """The latest invitation the first node wrote (None: none)."""
        i = self._state.invitation
        return i.as_announcement() if i is not None else None

    def ready(self, generation: int) -> None:
        """Say that this node's ranks are about to join ``generation`` (a newcomer's)."""
        if self._node:
            self._hand(Ready(self._node, generation))

    def ready_nodes(self) -> dict[str, int]:
        """Nodes whose ranks are ready to join a grown group, and the generation they join."""
        return dict(self._state.ready)

    def claim(self, lost: str) -> None:
        """Ask to take ``lost``'s place (the answer comes through :meth:`claimed_by`)."""
        self._hand(Claim(lost, self._node))

    def claimed_by(self, lost: str) -> str | None:
        """The node holding the claim on ``lost``'s place, once the store answered."""
        return self._state.claims.get(lost)

    # --- the poll, on the ticker's thread ---------------------------------------------------------

    def _idle(self, timeout_s: float) -> bool:
        """Between polls: wait up to ``timeout_s`` for a push. True (poll now) when a change was handed
        over or another board nudged; the lines read here count as read (beats, ends)."""
        with self._line_lock:
            fds = [*self._watch.fds(), *(self._line.fds() if self._line is not None else ())]
        woken, ready = self._waker.wait(timeout_s, fds)
        if not ready or self._stop.is_set():
            return woken or self._stop.is_set()
        with self._line_lock:
            if self._stop.is_set():
                return True
            nudged = self._line.drain(ready) if self._line is not None else False
            self._watch.read(ready)
            return woken or nudged or self._watch.take_nudge()

    def _nudge(self, relay: bool) -> None:
        """The document moved: tell the boards this one is connected to (``relay``: a watcher passing
        on what another board wrote tells only the agents it watches)."""
        with self._line_lock:
            if self._stop.is_set():
                return
            if self._line is not None and not relay:
                self._line.nudge()
            self._watch.nudge()

    def poll(self) -> None:
        """A beat on this agent's liveness line (before any store call: a slow store never silences
        it), then one exchange with the store (a new connection after a failed one)."""
        self._ticks += 1
        if self._ticks % BEAT_EVERY == 1:
            with self._line_lock:
                if self._line is not None and not self._stop.is_set():
                    self._line.beat()
        try:
            if self._store is None:
                from torch.distributed import TCPStore  # deferred: heavy (torch)

                self._store = TCPStore(
                    self._addr, self._port, None, False, timeout=self._timeout, wait_for_workers=False
                )
            self._exchange(self._store)
        except Exception:  # noqa: BLE001 - the store is unreachable: try again on a new connection
            self._store = None

    # Any: torch's Store, imported lazily (heavy)
    def _exchange(self, store: Any) -> None:
        """Write what was handed over; beat; read the document when the version moved."""
        self._polls += 1
        self._write(store)
        if self._node and self._polls % BEAT_EVERY == 1:
            store.add(BEAT + self._node, 1)
        version = store.add(VERSION, 0)
        if version != self._version:
            self._version = version
            if store.check([KEY]) and self._found(bytes(store.get(KEY))) and self._moved:
                self._nudge(relay=True)  # the nodes this one watches read it now, not at their next poll
        if self._incident and self._polls % WATCH_EVERY == 1:
            self._read_beats(store)
        self._liveness(store)
        self._answered = True

    # Any: torch's Store, imported lazily (heavy)
    def _liveness(self, store: Any) -> None:
        """Publish this agent's liveness line once; dial the watched nodes' lines (their sealed
        addresses, looked up every few polls until held); read the held lines. The lock guards the
        sockets only (close() runs on the owner's thread): no store call is made while holding it."""
        address = self._line.address if self._line is not None and not self._line_published else ""
        if address:
            store.set(LIVE + self._node, self._signer.seal(self._live_context(self._node), address))
            self._line_published = True
        if self._polls % WATCH_EVERY == 1:
            for n in [n for n in self._moved if not self._watch.connected(n)]:
                found = self._lookup(store, n)
                with self._line_lock:
                    if found and not self._stop.is_set():
                        self._watch.dial(n, found)
        with self._line_lock:
            if self._stop.is_set():
                return
            if self._line is not None:
                self._line.accept()
            self._watch.poll()
        self._check_heard()

    def _check_heard(self) -> None:
        """Outside an incident, for the watched lines quiet for :data:`HEARD_AFTER_S` or more: when did
        this host's kernel last take a segment from their hosts (health/link_counters.py, one local
        netlink dump, at most every :data:`HEARD_EVERY_S`)? A host behind a saturated link still
        delivers its agent's store calls and its ranks' data at the link's rate; a silent one
        delivers nothing. Where the address is shared (one machine, loopback), the others' traffic
        keeps it heard: no verdict from the line then, as before."""
        if self._incident:
            return
        with self._line_lock:
            quiet, hosts = self._watch.quiet(), self._watch.hosts()
        suspects = {
            n: hosts[n] for n, q in quiet.items() if q >= HEARD_AFTER_S and n in hosts and n in self._moved
        }
        now = self._clock()
        if not suspects:
            self._heard = (now, {})  # nothing quiet: nothing to read
            return
        if now - self._heard_asked < HEARD_EVERY_S:
            return
        self._heard_asked = now
        ages = self._read_heard(set(suspects.values()))
        if ages is None:
            return  # no reading (no ss, or it did not answer in time): stale soon, so no verdict
        self._heard = (now, {n: now - ages[h] for n, h in suspects.items() if h in ages})

    # Any: torch's Store, imported lazily (heavy)
    def _lookup(self, store: Any, node: str) -> str:
        """``node``'s liveness address when the store holds one sealed with the job key, else ""."""
        if not store.check([LIVE + node]):
            return ""
        opened = self._signer.open(self._live_context(node), bytes(store.get(LIVE + node)))
        if isinstance(opened, Opened):
            return opened.payload.decode(errors="replace")
        self.refusals.refused("an unsigned liveness address in the worker store", opened.reason)
        return ""

    def _live_context(self, node: str) -> str:
        return f"stalwart-live|{self._where}|{node}"

    # Any: torch's Store, imported lazily (heavy)
    def _write(self, store: Any) -> None:
        """The changes handed over, applied to the last authentic state and set by compare-and-set on
        the bytes last read; on a conflict, applied again to what the store holds (bounded)."""
        changes: list[Change] = []
        while self._changes:
            changes.append(self._changes.popleft())
        if not changes:
            return
        for _ in range(CAS_TRIES):
            new = write(self._state, tuple(changes))
            sealed = seal(self._signer, self._where, new)
            held = _bytes(store.compare_set(KEY, self._raw, sealed))
            if held == sealed:
                self._found(sealed, written=new)
                store.add(VERSION, 1)
                self._nudge(relay=False)
                return
            if held == self._raw and self._raw:
                self._raw = b""  # the key is gone (torch answers with the expected value): create it
                continue
            self._found(held)
        self._changes.extendleft(reversed(changes))  # still contended: the next poll tries again

    def _found(self, raw: bytes, written: BoardState | None = None) -> bool:
        """Take ``raw`` (read from the store, or ``written`` by this board) as the state when it is
        authentic; otherwise ignore it (counted, noted once), and base the next write on its bytes.
        Whether a new state was taken."""
        if written is None and raw == self._raw:
            return False  # read before: taken, or refused and counted then
        self._raw = raw
        got = (
            written
            if written is not None
            else open_state(self._signer, self._where, raw, self._state.version)
        )
        if isinstance(got, Unsound):
            self.refusals.refused(got.what, got.why)
            return False
        before, self._state = self._state, got
        a = got.announcement
        if a is not None and (self._seen is None or a.generation > self._seen.generation):
            self._seen = a
            self._incident = False  # the waits are answered: stop reading heartbeats
        answered = self._seen.generation if self._seen is not None else 0
        new_wait = any(g > answered and before.waiting.get(n) != g for n, g in got.waiting.items())
        if new_wait and self._moved and not self._incident:
            self._watch_from_now()
        return True

    def _watch_from_now(self) -> None:
        """Start reading the watched heartbeats; their silence counts from now, not from before."""
        now = self._clock()
        self._moved = dict.fromkeys(self._moved, now)
        self._beats = {}
        self._incident = True

    # Any: torch's Store, imported lazily (heavy)
    def _read_beats(self, store: Any) -> None:
        """The watched nodes' heartbeats: when each last moved."""
        for n in list(self._moved):
            count = store.add(BEAT + n, 0)
            if count != self._beats.get(n):
                self._beats[n] = count
                if count:  # a node that never beat keeps its silence from the incident's start
                    self._moved[n] = self._clock()


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


__all__ = ["BEAT", "KEY", "POLL_S", "VERSION", "Announcement", "ManualTicker", "StoreBoard", "ThreadTicker"]
