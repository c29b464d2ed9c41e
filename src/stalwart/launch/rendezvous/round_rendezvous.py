"""Stalwart's own rendezvous handler (``--rdzv-backend stalwart``): torch's public
``RendezvousHandler`` on the same c10d TCPStore as torch's c10d backend (the first agent hosts it),
with no pickle and no whole-state keep-alive.

torch's dynamic rendezvous keeps the whole state in one pickled key rewritten by compare-and-set, and
every agent's keep-alive rewrites it every second: the store's bytes grow with N^2, and at 128 agents
on one host the writes cannot all land (docs/benchmarks.md, issue 39). Here each round ``r`` has its
own keys under ``stalwart/rdzv/<run id>/r<r>/``:

* ``count``: each joiner takes an arrival number with ``add(count, 1)``; ``back``: those that were
  members of round ``r - 1`` add to it too;
* ``join/<arrival>``: each joiner's descriptor (host, a free port, its previous round and rank);
* ``rank/<closer>/<arrival>``: each member's rank, written by the closer (one ``multi_set``) before
* ``result``: written once, by compare-and-set (the first writer wins): who closed the round (whose
  rank records hold), its size and rank 0's address. No record every member reads grows with N.

The first arrival leads: it sleeps on the store (``wait`` on the next arrival's key, bounded) until
the round may close (launch/rendezvous/round_policy.py: ``max_nodes`` there, or ``min_nodes`` and the
last call), reads the join keys in one ``multi_get`` and writes the result. The others ``wait`` on the
result key with a deadline; one whose round has been closable for the takeover bound without a
result closes it itself (the leader died). A node whose arrival is not in the result joins the next
round; the running group's agents read ``num_nodes_waiting`` (one ``add(..., 0)`` on the next round's
counter) and re-rendezvous into it. After a round forms, nothing is written: a dead member is absent
from the next round.

Every value another agent reads is sealed with the job key (job_key.Signer), bound to its key and
round; a record whose seal fails is counted (job_key.Refusals) and never trusted: a join record is
left out, a result is replaced by compare-and-set with one computed here, a closed mark is ignored.
"""

from __future__ import annotations

import datetime
import secrets
import socket
from typing import NoReturn

from torch.distributed import DistStoreError, PrefixStore, Store
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from typing_extensions import assert_never

from ...job_key import Opened, Refusals, Refused, Signer
from ..clock import Clock, SystemClock
from .round_policy import (
    RECHECK_S,
    Bounds,
    Closing,
    Joiner,
    RoundResult,
    RoundView,
    Verdict,
    choose,
    closing,
    ready,
    takeover,
    view_of,
    wake_at,
)

BACKEND = "stalwart"
JOIN_GRACE_S = 2.0  # the leader waits at most this long for a counted joiner's record
TAKEOVER_S = 5.0  # beyond the last call: how long members let a closable round wait for its leader
CLOSED = "closed"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class RoundRendezvousHandler(RendezvousHandler):
    """Rounds of arrival numbers, one signed result each (the module docstring)."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        signer: Signer,
        refusals: Refusals,
        bounds: Bounds,
        *,
        timeout_s: float,
        local_addr: str | None = None,
        takeover_s: float | None = None,
        join_grace_s: float = JOIN_GRACE_S,
        clock: Clock | None = None,
    ) -> None:
        self.store, self.run_id, self.signer, self.refusals = store, run_id, signer, refusals
        self.bounds, self.timeout_s, self.join_grace_s = bounds, timeout_s, join_grace_s
        self.takeover_s = bounds.last_call_s + TAKEOVER_S if takeover_s is None else takeover_s
        self.host = local_addr or socket.gethostname()
        self.node = secrets.token_hex(8)  # tells this handler's join records apart from others'
        self.clock: Clock = clock or SystemClock()
        self.prefix = f"stalwart/rdzv/{run_id}"
        self.last: RoundResult | None = None  # the last round this agent was a member of
        self.rank = 0  # this agent's rank in it

    # the store's keys --------------------------------------------------------------------------

    def _key(self, rnd: int, name: str) -> str:
        return f"{self.prefix}/r{rnd}/{name}"

    def _seal(self, key: str, payload: bytes) -> bytes:
        return self.signer.seal(f"rdzv|{key}", payload)

    def _open(self, key: str, stored: bytes, what: str) -> bytes | None:
        match self.signer.open(f"rdzv|{key}", stored):
            case Opened(payload):
                return payload
            case Refused(reason):
                self.refusals.refused(what, reason)
                return None

    def _read_result(self, rnd: int, stored: bytes) -> RoundResult | None:
        payload = self._open(self._key(rnd, "result"), stored, "a rendezvous round's result")
        if payload is None:
            return None
        try:
            got = RoundResult.decode(payload)
        except ValueError as exc:
            self.refusals.refused("a rendezvous round's result", str(exc))
            return None
        if got.round != rnd:
            self.refusals.refused("a rendezvous round's result", f"it is round {got.round}'s, not {rnd}'s")
            return None
        return got

    def _result(self, rnd: int) -> tuple[RoundResult | None, bytes | None]:
        """Round ``rnd``'s result (None while open or refused) and the bytes stored there (None: none)."""
        key = self._key(rnd, "result")
        if not self.store.check([key]):
            return None, None
        stored = self.store.get(key)
        return self._read_result(rnd, stored), stored

    def _set(self, key: str, payload: bytes) -> None:
        """``payload`` sealed under ``key`` (torch's Store.set stub says str; its C++ takes bytes)."""
        self.store.set(key, self._seal(key, payload))  # type: ignore[arg-type]

    def _wait(self, keys: list[str], seconds: float) -> bool:
        """Whether ``keys`` all exist within ``seconds`` (the store's wait, bounded)."""
        if seconds <= 0:
            return bool(self.store.check(keys))
        try:
            self.store.wait(keys, datetime.timedelta(seconds=seconds))
        except DistStoreError:
            return False
        return True

    # torch's interface -------------------------------------------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    def get_run_id(self) -> str:
        return self.run_id

    def is_closed(self) -> bool:
        key = f"{self.prefix}/closed"
        if not self.store.check([key]):
            return False
        return self._open(key, self.store.get(key), "a rendezvous closed mark") == CLOSED.encode()

    def set_closed(self) -> None:
        key = f"{self.prefix}/closed"
        self._set(key, CLOSED.encode())

    def shutdown(self) -> bool:
        try:
            self.set_closed()
        except DistStoreError:
            return False
        return True

    def num_nodes_waiting(self) -> int:
        """Nodes that arrived for the round after this agent's: one ``add(count, 0)`` (and one more
        when the group is full: then only its own members coming back count, not hot spares)."""
        last = self.last
        if last is None:
            return 0
        count = int(self.store.add(self._key(last.round + 1, "count"), 0))
        if count == 0 or last.size < self.bounds.max_nodes:
            return count
        return int(self.store.add(self._key(last.round + 1, "back"), 0))

    def next_rendezvous(self) -> RendezvousInfo:
        deadline = self.clock.monotonic() + self.timeout_s
        self._refuse_closed()
        rnd = self.last.round + 1 if self.last is not None else self._latest() + 1
        while True:
            got = self._join(rnd, deadline)
            if got is not None:
                result, rank = got
                self.last, self.rank = result, rank
                store = PrefixStore(self._key(rnd, "store"), self.store)
                info = RendezvousStoreInfo(result.master_host, result.master_port)
                return RendezvousInfo(store, rank, result.size, info)
            rnd += 1  # late for this round: a waiting node of the next

    # a round -----------------------------------------------------------------------------------

    def _refuse_closed(self) -> None:
        if self.is_closed():
            raise RendezvousClosedError(f"the rendezvous of run {self.run_id} is closed (the job ended)")

    def _latest(self) -> int:
        """The newest round that closed, as its closer recorded it (-1: none, or the record refused;
        a stale one only costs a step per round that closed since)."""
        key = f"{self.prefix}/latest"
        if not self.store.check([key]):
            return -1
        payload = self._open(key, self.store.get(key), "a rendezvous latest-round mark")
        try:
            return int(payload or b"-1")
        except ValueError:
            return -1

    def _join(self, rnd: int, deadline: float) -> tuple[RoundResult, int] | None:
        """Join round ``rnd``: (its result, this agent's rank), or None when it closed without it."""
        arrival = int(self.store.add(self._key(rnd, "count"), 1))
        result, _ = self._result(rnd)
        if result is not None:  # it closed before this arrival
            rank = self._rank_in(result, arrival)
            return None if rank is None else (result, rank)
        last = self.last
        prev_round, prev_rank = -1, -1
        if last is not None and last.round == rnd - 1:
            prev_round, prev_rank = last.round, self.rank
            self.store.add(self._key(rnd, "back"), 1)
        key = self._key(rnd, f"join/{arrival}")
        me = Joiner(arrival, self.host, _free_port(), prev_round, prev_rank, self.node)
        self._set(key, me.encode())
        result = self._lead(rnd, arrival, deadline) if arrival == 1 else self._follow(rnd, arrival, deadline)
        rank = self._rank_in(result, arrival)
        return None if rank is None else (result, rank)

    def _rank_in(self, result: RoundResult, arrival: int) -> int | None:
        """This arrival's rank in the closed round (None: not a member, or its record refused)."""
        key = self._key(result.round, f"rank/{result.closer}/{arrival}")
        if not self.store.check([key]):
            return None
        payload = self._open(key, self.store.get(key), "a rendezvous rank record")
        try:
            rank = int(payload or b"-1")
        except ValueError:
            rank = -1
        return rank if 0 <= rank < result.size else None

    def _previous(self, rnd: int) -> RoundResult | None:
        """Round ``rnd - 1``'s result, whose members the round waits for (None: the first round)."""
        if rnd == 0:
            return None
        if self.last is not None and self.last.round == rnd - 1:
            return self.last
        return self._result(rnd - 1)[0]

    def _view(self, rnd: int, previous: RoundResult | None) -> RoundView:
        count = int(self.store.add(self._key(rnd, "count"), 0))
        back = int(self.store.add(self._key(rnd, "back"), 0)) if previous else 0
        return RoundView(count, back, previous.size if previous else 0)

    def _lead(self, rnd: int, arrival: int, deadline: float) -> RoundResult:
        """The first arrival: sleep on an arrival's key (round_policy.wake_at) until the round may close,
        then close it."""
        previous = self._previous(rnd)
        ready_at: float | None = None
        while True:
            self._refuse_closed()
            view, ready_at, decision, _ = self._look(rnd, previous, ready_at, deadline)
            match decision.verdict:
                case Verdict.CLOSE:
                    closed = self._close_or_short(rnd, arrival, view.count, previous, None, deadline)
                    if closed is not None:
                        return closed
                    self._wait([self._key(rnd, f"join/{view.count + 1}")], RECHECK_S)  # counters lied
                case Verdict.TIMEOUT:
                    self._timed_out(rnd, decision)
                case Verdict.WAIT:
                    result, _ = self._result(rnd)  # a member closed it (this leader was taken for dead)
                    if result is not None:
                        return result
                    self._wait([self._key(rnd, f"join/{wake_at(view, self.bounds)}")], decision.recheck_s)
                case _:
                    assert_never(decision.verdict)

    def _follow(self, rnd: int, arrival: int, deadline: float) -> RoundResult:
        """Wait on the result; close the round here when its leader left it closable too long."""
        previous: RoundResult | None = None
        looked = False
        ready_at: float | None = None
        closable_at: float | None = None
        key = self._key(rnd, "result")
        while True:
            left = deadline - self.clock.monotonic()
            stored: bytes | None = None
            if self._wait([key], min(max(left, 0.0), self.takeover_s)):
                stored = self.store.get(key)
                result = self._read_result(rnd, stored)
                if result is not None:
                    return result
                self.clock.sleep(min(max(left, 0.0), 0.1))  # a refused record: no wait can wake on it
            self._refuse_closed()
            if not looked:
                previous, looked = self._previous(rnd), True
            view, ready_at, decision, now = self._look(rnd, previous, ready_at, deadline)
            if decision.verdict is Verdict.CLOSE and closable_at is None:
                closable_at = now
            decision = takeover(decision, None if closable_at is None else now - closable_at, self.takeover_s)
            match decision.verdict:
                case Verdict.CLOSE:
                    closed = self._close_or_short(rnd, arrival, view.count, previous, stored, deadline)
                    if closed is not None:
                        return closed
                case Verdict.TIMEOUT:
                    self._timed_out(rnd, decision)
                case Verdict.WAIT:
                    pass
                case _:
                    assert_never(decision.verdict)

    def _look(
        self, rnd: int, previous: RoundResult | None, ready_at: float | None, deadline: float
    ) -> tuple[RoundView, float | None, Closing, float]:
        """One look at the round's counters: the view, since when it is ready, the verdict, now."""
        view, now = self._view(rnd, previous), self.clock.monotonic()
        if ready_at is None and ready(view, self.bounds):
            ready_at = now
        ready_for = None if ready_at is None else now - ready_at
        return view, ready_at, closing(view, self.bounds, ready_for, deadline - now), now

    def _timed_out(self, rnd: int, decision: Closing) -> NoReturn:
        raise RendezvousTimeoutError(f"round {rnd} of run {self.run_id}: {decision.reason}")

    def _close_or_short(
        self,
        rnd: int,
        arrival: int,
        count: int,
        previous: RoundResult | None,
        planted: bytes | None,
        deadline: float,
    ) -> RoundResult | None:
        """:meth:`_close`; when the signed records did not bear the counters out and the deadline has
        passed, the round timed out."""
        closed = self._close(rnd, arrival, count, previous, planted)
        if closed is None and self.clock.monotonic() >= deadline:
            raise RendezvousTimeoutError(
                f"round {rnd} of run {self.run_id}: fewer than {self.bounds.min_nodes} signed join records"
            )
        return closed

    def _joiners(self, rnd: int, count: int) -> list[Joiner]:
        """The join records of arrivals 1..count that came within the grace, authentic, in one read."""
        keys = [self._key(rnd, f"join/{i}") for i in range(1, count + 1)]
        if not self._wait(keys, self.join_grace_s):  # a joiner died between its count and its record
            keys = [k for k in keys if self.store.check([k])]
        joiners = []
        for key, stored in zip(keys, self.store.multi_get(keys) if keys else [], strict=True):
            payload = self._open(key, stored, "a rendezvous join record")
            if payload is None:
                continue
            try:
                joiners.append(Joiner.decode(int(key.rpartition("/")[2]), payload))
            except ValueError as exc:
                self.refusals.refused("a rendezvous join record", str(exc))
        return joiners

    def _close(
        self, rnd: int, arrival: int, count: int, previous: RoundResult | None, planted: bytes | None
    ) -> RoundResult | None:
        """Write the round's one result (first writer wins) and return the one that holds; None when
        the signed join records do not make the round ready (the counters are only hints: a forged
        bump or a joiner that died between its count and its record never closes a round)."""
        joiners = self._joiners(rnd, count)
        prev_round = previous.round if previous else -1
        if not ready(view_of(joiners, prev_round, previous.size if previous else 0), self.bounds):
            return None
        members = choose(joiners, prev_round, self.bounds.max_nodes)
        mine = RoundResult(rnd, arrival, len(members), members[0].host, members[0].port)
        ranks = [self._key(rnd, f"rank/{arrival}/{j.arrival}") for j in members]  # before the result
        sealed_ranks = [self._seal(k, str(i).encode()) for i, k in enumerate(ranks)]
        self.store.multi_set(ranks, sealed_ranks)  # type: ignore[attr-defined]  # torch's stub lacks it
        key = self._key(rnd, "result")
        sealed = self._seal(key, mine.encode())
        expected = planted if planted is not None else b""
        for _ in range(3):
            stored = self.store.compare_set(key, expected, sealed)  # type: ignore[arg-type]  # bytes, as set
            if stored == sealed:
                break
            held = self._read_result(rnd, stored)
            if held is not None:  # another closer won: every member reads its result
                return held
            expected = stored  # planted bytes hold the key: replace them (they are no one's result)
        else:
            raise RendezvousStateError(f"round {rnd} of run {self.run_id}: its result key keeps changing")
        latest = f"{self.prefix}/latest"
        self._set(latest, str(rnd).encode())
        return mine


__all__ = ["BACKEND", "RoundRendezvousHandler"]
