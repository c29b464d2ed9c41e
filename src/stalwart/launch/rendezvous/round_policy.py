"""The decisions of Stalwart's own rendezvous (launch/rendezvous/round_rendezvous.py), pure: when a
round may close, when a member closes a round its leader left open, which joiners a closed round
takes, and how its records read and write. No store, no clock: the handler passes what it read and
the seconds it measured, and gets a decision with its reason.

A round: every joiner takes an arrival number (the store's ``add``) and writes its descriptor; the
first arrival leads. The round is *ready* once ``min_nodes`` have arrived and, when an earlier round
formed a group, at least one of that group has come back (a newcomer alone never starts a round
beside a group that still runs: it waits for the group to re-rendezvous). It closes at once when
``max_nodes`` have arrived and the whole previous group is back, or once it has been ready for the
last call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from typing_extensions import assert_never

RECHECK_S = 1.0  # the longest a waiting leader sleeps between two looks at its round


class Verdict(Enum):
    CLOSE = "close"
    WAIT = "wait"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class Bounds:
    min_nodes: int
    max_nodes: int
    last_call_s: float


@dataclass(frozen=True)
class RoundView:
    """What one look at a round's counters shows."""

    count: int  # arrivals so far
    back: int  # arrivals that were members of the previous round
    previous: int  # members of the previous round (0: no group formed before it)


@dataclass(frozen=True)
class Closing:
    verdict: Verdict
    reason: str
    recheck_s: float = 0.0  # WAIT: look again after this long at the latest


def ready(view: RoundView, bounds: Bounds) -> bool:
    """Enough have arrived, and a group that ran before (if any) has begun to come back."""
    return view.count >= bounds.min_nodes and (view.previous == 0 or view.back >= 1)


def closing(view: RoundView, bounds: Bounds, ready_for_s: float | None, left_s: float) -> Closing:
    """Whether the round closes now. ``ready_for_s``: seconds since the caller first saw it ready
    (None: not yet); ``left_s``: seconds left before the join deadline."""
    if ready(view, bounds) and view.count >= bounds.max_nodes and view.back >= view.previous:
        return Closing(Verdict.CLOSE, f"{view.count} arrived, at least --nnodes max ({bounds.max_nodes})")
    if ready(view, bounds) and ready_for_s is not None and ready_for_s >= bounds.last_call_s:
        return Closing(
            Verdict.CLOSE,
            f"{view.count} arrived (min {bounds.min_nodes}), last call of {bounds.last_call_s:g} s over",
        )
    if left_s <= 0:
        return Closing(Verdict.TIMEOUT, _short(view, bounds))
    if not ready(view, bounds):
        return Closing(Verdict.WAIT, _short(view, bounds), min(left_s, RECHECK_S))
    wait = bounds.last_call_s - (ready_for_s or 0.0)
    return Closing(Verdict.WAIT, f"last call: {wait:.2f} s left", max(0.0, min(left_s, wait)))


def _short(view: RoundView, bounds: Bounds) -> str:
    if view.count < bounds.min_nodes:
        return f"{view.count} of at least {bounds.min_nodes} nodes arrived"
    return f"none of the running group's {view.previous} nodes came back yet"


def wake_at(view: RoundView, bounds: Bounds) -> int:
    """The arrival whose join record a waiting leader sleeps on: the min-th while fewer came, then the
    max-th (the last call's timeout wakes it before), always a later one than it saw. So the leader
    wakes a few times a round, not once per arrival (a round trip each over a network)."""
    target = bounds.min_nodes if view.count < bounds.min_nodes else bounds.max_nodes
    return max(target, view.count + 1)


def takeover(decision: Closing, closable_for_s: float | None, takeover_s: float) -> Closing:
    """A member (not the leader) closes the round itself only when the round has been closable for
    ``takeover_s`` by its own looks and still has no result: the leader died or stalled."""
    match decision.verdict:
        case Verdict.CLOSE:
            if closable_for_s is not None and closable_for_s >= takeover_s:
                return Closing(
                    Verdict.CLOSE, f"the leader left it open {closable_for_s:.1f} s: {decision.reason}"
                )
            return Closing(Verdict.WAIT, "the leader closes it", takeover_s - (closable_for_s or 0.0))
        case Verdict.WAIT | Verdict.TIMEOUT:
            return decision
        case _:
            assert_never(decision.verdict)


@dataclass(frozen=True)
class Joiner:
    """One node's join record for a round (its descriptor)."""

    arrival: int
    host: str
    port: int  # a free port on the host (rank 0's is the workers' bootstrap port)
    prev_round: int  # the last round it was a member of (-1: none)
    prev_rank: int
    node: str = ""  # the handler's own random token: one node that joined a round twice counts once

    def encode(self) -> bytes:
        return json.dumps([self.host, self.port, self.prev_round, self.prev_rank, self.node]).encode()

    @staticmethod
    def decode(arrival: int, data: bytes) -> Joiner:
        """Raises ValueError when the record is not a join record."""
        try:
            host, port, prev_round, prev_rank, node = json.loads(data)
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"not a join record: {exc}") from None
        if not (isinstance(host, str) and isinstance(node, str)):
            raise ValueError("not a join record: wrong field types")
        if not all(type(v) is int for v in (port, prev_round, prev_rank)):
            raise ValueError("not a join record: wrong field types")
        return Joiner(arrival, host, port, prev_round, prev_rank, node)


def choose(joiners: list[Joiner], previous_round: int, max_nodes: int) -> tuple[Joiner, ...]:
    """The round's members in rank order: the previous group's members first, in their old rank order
    (they keep their ranks as far as they can), then the others by arrival; at most ``max_nodes``. A
    node that joined twice (it gave up on the round once and came back) counts by its last arrival."""
    last = {j.node or f"arrival {j.arrival}": j for j in sorted(joiners, key=lambda j: j.arrival)}
    unique = list(last.values())
    back = sorted((j for j in unique if j.prev_round == previous_round >= 0), key=lambda j: j.prev_rank)
    new = sorted((j for j in unique if not (j.prev_round == previous_round >= 0)), key=lambda j: j.arrival)
    return tuple([*back, *new][:max_nodes])


def view_of(joiners: list[Joiner], previous_round: int, previous: int) -> RoundView:
    """The round as its signed join records show it (the counters are unsigned hints)."""
    joiners = list({j.node or f"arrival {j.arrival}": j for j in joiners}.values())
    back = sum(1 for j in joiners if j.prev_round == previous_round >= 0)
    return RoundView(len(joiners), back, previous)


@dataclass(frozen=True)
class RoundResult:
    """A closed round: who closed it (its arrival number: the rank records are under it), how many
    members it took and rank 0's address. Its size does not grow with the group: each member reads
    its own rank from a record of its own."""

    round: int
    closer: int
    size: int
    master_host: str
    master_port: int

    def encode(self) -> bytes:
        body = [self.round, self.closer, self.size, self.master_host, self.master_port]
        return json.dumps(body, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes) -> RoundResult:
        """Raises ValueError when the record is not a round's result."""
        try:
            rnd, closer, size, host, port = json.loads(data)
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"not a round result: {exc}") from None
        if not (all(type(v) is int for v in (rnd, closer, size, port)) and isinstance(host, str)):
            raise ValueError("not a round result: wrong field types")
        if size < 1:
            raise ValueError("not a round result: no members")
        return RoundResult(rnd, closer, size, host, port)


__all__ = [
    "Bounds",
    "Closing",
    "Joiner",
    "RoundResult",
    "RoundView",
    "Verdict",
    "choose",
    "closing",
    "ready",
    "takeover",
    "view_of",
    "wake_at",
]
