"""In-place recovery across nodes, when the group changes size (docs/fast-recovery.md).

Both are decided only by the group's first node (the one that watches the others' heartbeats), so
exactly one node announces, and applied through the same board and control block as any generation:

* **shrink**: a node is lost and the round has no hot spare. The pure policy
  (:func:`~stalwart.policy.inplace.shrink`) drops it; the surviving nodes keep their processes and
  re-form at the smaller world size in their old order.
* **grow**: a node that arrived while the job runs offered a free place (launch/rejoin.py). The pure
  policy (:func:`~stalwart.policy.inplace.grow`) takes it in at the next group ranks. First an
  invitation: the newcomer starts its ranks in the next generation while the group trains on; once
  they are about to join (each newcomer's agent says so on the board), the announcement: the nodes
  in the group keep their processes and places, re-form at the next step boundary, and a replica
  sends the newcomer's ranks the live state.

Each writes the group's new nodes and size to the board (what a node arriving later reads), asks the
local ranks to join in their places, and records :class:`~stalwart.events.ReformedInPlace` once they
did (:meth:`InPlaceRecovery._took_over`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from typing_extensions import assert_never

from ..diagnose.incident import silent_host_incident
from ..events import FailureDetected
from ..policy.inplace import GrowCase, GrowInPlace, Refuse, ShrinkCase, ShrinkInPlace, Wait, grow, shrink
from .board_records import Announcement
from .snapshot import Snapshot

if TYPE_CHECKING:
    from .inplace import InPlaceRecovery


def interrupted_step(rec: InPlaceRecovery) -> int:
    """The lowest step not completed by every local rank (the one a re-formation may interrupt)."""
    return min((q.last_done + 1 for q in rec.tracker.progress.values()), default=0)


def shrink_group(
    rec: InPlaceRecovery, lost: tuple[str, ...], silent: dict[str, float], snap: Snapshot
) -> bool:
    """A lost node and no hot spare: re-form the survivors in place at the smaller size (announced,
    then joined like any generation), or refuse; False when another node (or a spare) decides."""
    cfg = rec.cfg
    settings = cfg.reform  # type: ignore[attr-defined]
    choice = shrink(
        ShrinkCase(
            enabled=settings.enabled,
            stopping=snap.stop_requested_at is not None,
            node=rec.node,
            active=rec.active,
            lost=lost,
            spares=rec.spares,
            nproc_per_node=cfg.nproc_per_node,  # type: ignore[attr-defined]
            min_nodes=cfg.min_nodes,  # type: ignore[attr-defined]
            rule=cfg.size_rule,  # type: ignore[attr-defined]
            generation=max(rec.generation, rec.invited),  # past a grow's invitation, if any
        )
    )
    match choice:
        case Wait():
            return False
        case Refuse(reason=reason):
            rec._refuse(reason, snap.now)
        case ShrinkInPlace(active=active, world_size=world, generation=gen, reason=reason):
            assert rec.board is not None
            cancel_invitation(rec, "a node was lost during the grow", snap.now)
            old = rec.world_size
            quiet = max(silent.get(n, 0.0) for n in lost)
            gone = ", ".join(lost)
            rec.ledger.emit(  # the lost node's failure, as this node detected it (its agent is gone)
                FailureDetected(
                    ts=snap.now,
                    failure="agent_lost",
                    evidence=f"node {gone}: no heartbeat for {quiet:.1f}s while its peers wait",
                    onset=snap.now - quiet,
                    rank=min(rec.active.index(n) for n in lost) * cfg.nproc_per_node,  # type: ignore[attr-defined]
                    **rec.ledger.ctx(),
                )
            )
            rec.ledger.emit(
                silent_host_incident(
                    lost, rec.node, quiet, snap.now, f"re-formed the group in place without host {gone}"
                ).to_event(**rec.ledger.ctx())
            )
            rec._record("shrink_in_place", reason, snap.now)
            shrunk = Announcement(gen, rec.node, (), world, active)
            _announce(rec, shrunk, reason, snap.now)
            rec.resized = ("shrink", old, interrupted_step(rec))
        case _:
            assert_never(choice)
    return True


@dataclass(frozen=True)
class Invitation:
    """A grow under way: the newcomers start their ranks in ``a.generation`` while the group trains on."""

    a: Announcement  # the group after the grow (announced once every newcomer's ranks are ready)
    joining: tuple[str, ...]
    old: int  # the world size before
    deadline: float  # on the agent's clock
    bound_s: float
    reason: str


def grow_group(rec: InPlaceRecovery, snap: Snapshot) -> bool:
    """Nodes offered a free place: invite them; once every newcomer's ranks are ready, re-form the
    group with them at the next step boundary. The group trains on while the newcomers start (their
    processes, imports and set-up), so the pause is the re-formation alone. False when nothing is
    under way (no offer, not the first node, an incident or re-formation under way, no valid size)."""
    board = rec.board
    if board is None or not rec.active or rec.active[0] != rec.node:
        return False
    if rec.inviting is not None:
        return _follow_invitation(rec, rec.inviting, snap)
    # an offer whose invitation was given up stands until that node offers anew (it starts again)
    offers = tuple(n for n in board.offers() if rec.given_up.get(n) != board.offer_seq(n))
    if not offers:
        return False
    cfg = rec.cfg
    settings = cfg.reform  # type: ignore[attr-defined]
    choice = grow(
        GrowCase(
            enabled=settings.enabled,
            stopping=snap.stop_requested_at is not None,
            busy=rec.pending is not None or rec.taking_over is not None or rec.refused,
            node=rec.node,
            active=rec.active,
            offers=offers,
            nproc_per_node=cfg.nproc_per_node,  # type: ignore[attr-defined]
            max_nodes=cfg.max_nodes,  # type: ignore[attr-defined]
            rule=cfg.size_rule,  # type: ignore[attr-defined]
            # past any generation invited before: a readiness left from a given-up invitation is stale
            generation=max(rec.generation, rec.invited),
        )
    )
    match choice:
        case Wait():
            return False
        case GrowInPlace(active=active, joining=joining, world_size=world, generation=gen, reason=reason):
            old = rec.world_size
            rec._record("grow_in_place", reason, snap.now)
            invited = Announcement(gen, rec.node, tuple(range(old, world)), world, active)
            board.invite(invited)
            rec.invited = gen
            bound = float(settings.timeout_s)
            rec.inviting = Invitation(invited, joining, old, snap.now + bound, bound, reason)
            return True
        case _:
            assert_never(choice)


def _follow_invitation(rec: InPlaceRecovery, inv: Invitation, snap: Snapshot) -> bool:
    assert rec.board is not None
    ready = rec.board.ready_nodes()
    if all(ready.get(n) == inv.a.generation for n in inv.joining):
        rec.inviting = None
        rec.board.watch_more(inv.joining)
        interrupted = interrupted_step(rec)
        _announce(rec, inv.a, inv.reason, snap.now)
        rec.resized = ("grow", inv.old, interrupted)
        return True
    if snap.now >= inv.deadline:
        cancel_invitation(
            rec,
            f"the ranks of node {', '.join(inv.joining)} were not ready to join generation "
            f"{inv.a.generation} within {inv.bound_s:g}s",
            snap.now,
        )
        return False
    return True


def cancel_invitation(rec: InPlaceRecovery, why: str, now: float) -> None:
    """Give a grow up: the group goes on at its size; the newcomers' ranks time out joining, and
    their agent joins the rendezvous (the whole group then restarts with it)."""
    inv = rec.inviting
    if inv is None:
        return
    rec.inviting = None
    if rec.board is not None:
        for n in inv.joining:
            rec.given_up[n] = rec.board.offer_seq(n)
    rec._record("grow_in_place_failed", f"{why}: the group goes on at {inv.old} processes", now)


def _announce(rec: InPlaceRecovery, a: Announcement, reason: str, now: float) -> None:
    """Tell the other nodes (and nodes arriving later) the group's new nodes and size, and ask the
    local ranks to join in their places."""
    assert rec.board is not None
    rec.board.publish_group(a)
    rec.board.announce(a)
    rec._join(a.generation, a, reason, now, record=False)
    rec.taking_over = rec.clock.now()
