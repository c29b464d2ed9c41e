"""Which rank a hang is pinned on, and how a node stops its part of a hung group.

In a hung group every rank falls silent, so the rank the hang monitor saw fall silent first is often
a peer waiting for the hung one. :func:`hang_culprits` pins the hang on evidence that does not depend
on that order (a stopped process, a missing stack, a stack outside the collective the others wait in).
:func:`hang_stop` then decides how this node stops its ranks: the hung rank first when its peers leave
their live state on a peer's failure (train/left_state.py), so that their collectives fail on its
closed connections instead of their being killed inside them; and, across nodes, a node whose ranks
all wait in a collective holds its stop for the node that holds the hung rank (docs/fast-recovery.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing_extensions import assert_never

from .label import Label


class HangEvidence(Label):
    """What pinned a hang on its ranks (:func:`hang_culprits`)."""

    STOPPED = "stopped"  # the kernel shows them stopped
    SILENT = "silent"  # they did not dump their stacks while most ranks did
    OUTSIDE = "outside"  # their stacks stand outside the collective their peers wait in
    NONE = "none"  # nothing tells the hung rank from the ranks waiting on it

    @property
    def says(self) -> str:
        """What the evidence says of a pinned rank, after "rank N "."""
        match self:
            case HangEvidence.STOPPED:
                return "is stopped (state T)"
            case HangEvidence.SILENT:
                return "did not answer the request for its stack while its peers did"
            case HangEvidence.OUTSIDE:
                return "stands outside the collective its peers wait in (their stacks)"
            case HangEvidence.NONE:
                return "could not be told from its peers"
            case _:
                assert_never(self)


@dataclass(frozen=True)
class HangCulprits:
    """The ranks a hang is pinned on and what pinned it; ``answered``: the ranks whose stacks were
    read, ``waiting``: those among them waiting in a collective (the evidence :func:`hang_stop` reads)."""

    ranks: frozenset[int]
    evidence: HangEvidence
    answered: frozenset[int] = frozenset()
    waiting: frozenset[int] = frozenset()


def hang_culprits(
    states: dict[int, str], answered: frozenset[int], waiting: frozenset[int] = frozenset()
) -> HangCulprits:
    """The ranks a hang is pinned on, from evidence that does not depend on which rank the hang
    monitor saw fall silent first (in a hung group every rank falls silent): the ranks the kernel
    shows stopped (``T``/``t``); else, when a majority of ranks answered the request for their
    stacks: the ones whose stacks show them outside any collective while others wait in one
    (``waiting``: diagnose/hang.py ``waits_in_collective``), else the ranks that did not answer. A
    stack read is stronger evidence than a missing one: on a busy machine a waiting peer can be late
    to answer. No ranks when nothing tells the hung rank from its peers."""
    ranks = frozenset(states)
    seen = answered & ranks
    waiting = waiting & seen

    def pinned(on: frozenset[int], evidence: HangEvidence) -> HangCulprits:
        return HangCulprits(on, evidence, seen, waiting)

    stopped = frozenset(r for r, st in states.items() if st in ("T", "t"))
    if stopped:
        return pinned(stopped, HangEvidence.STOPPED)
    if not seen or 2 * len(seen) <= len(ranks):
        return pinned(frozenset(), HangEvidence.NONE)
    if waiting and (outside := seen - waiting):
        return pinned(outside, HangEvidence.OUTSIDE)
    if silent := ranks - seen:
        return pinned(silent, HangEvidence.SILENT)
    return pinned(frozenset(), HangEvidence.NONE)


# a node whose ranks all wait for another node's hung rank holds its stop this many stop graces: that
# node's detection can come up to one grace later, and its ranks' peers need one to leave their state
HOLD_GRACES = 2


class HangStopKind(Label):
    """How a node stops its ranks of a hung group."""

    AT_ONCE = "at once"  # every rank killed now: nothing to wait for
    HUNG_FIRST = "hung first"  # the pinned ranks killed, their peers given the stop grace
    HOLD = "hold"  # nothing killed yet: the hung rank is on another node, whose agent kills it first


@dataclass(frozen=True)
class HangStop:
    kind: HangStopKind
    first: frozenset[int]  # HUNG_FIRST: the ranks killed before the others
    reason: str


def hang_stop(
    pinned: HangCulprits, local: frozenset[int], *, other_nodes: bool, leaves_state: bool
) -> HangStop:
    """How this node stops its ``local`` ranks of a hung group, from the evidence its own ranks gave
    (``pinned``: :func:`hang_culprits` over them); ``other_nodes``: the group spans other nodes too;
    ``leaves_state``: its ranks leave their live state when a peer fails (within the stop grace).

    Killing a rank that waits in a collective loses what it would leave; killing the hung rank first
    makes its peers' collectives fail on its closed connections, and they leave their state. So:
    the pinned ranks first; across nodes, where this node's stacks alone cannot compare ranks, a node
    whose every rank answered and stands outside any collective has them killed first (the node of
    the hung rank), and a node whose every rank answered and waits in a collective holds (the hung
    rank is elsewhere: its node kills it, and these ranks' collectives then fail by themselves).
    Otherwise, or when the ranks leave nothing, every rank is stopped at once."""
    if not leaves_state:
        return HangStop(
            HangStopKind.AT_ONCE, frozenset(), "its ranks leave no live state: nothing to wait for"
        )
    if first := pinned.ranks & local:
        return HangStop(HangStopKind.HUNG_FIRST, first, f"{_ranks(first)} {pinned.evidence.says}")
    if other_nodes and local and local <= pinned.answered:
        if local <= pinned.waiting:
            return HangStop(
                HangStopKind.HOLD,
                frozenset(),
                "every rank of this node waits in a collective: the hung rank is on another node, "
                "whose agent kills it first; the collectives here then fail, and the ranks leave their state",
            )
        if not local & pinned.waiting:
            return HangStop(
                HangStopKind.HUNG_FIRST,
                local,
                f"{_ranks(local)} of this node {'stands' if len(local) == 1 else 'stand'} outside any "
                "collective while the group spans other nodes: this node holds the hung rank",
            )
    return HangStop(HangStopKind.AT_ONCE, frozenset(), "nothing on this node names the hung rank")


def _ranks(ranks: frozenset[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))
