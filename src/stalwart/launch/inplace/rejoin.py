"""A node that arrives while the job runs, taken back into a group that shrank in place.

When a lost node's survivors shrank the group in place (launch/inplace/nodes.py), the job trains at
a smaller world size. A node that starts later (the lost host back after a repair, or a new one)
would, on joining the rendezvous, make every agent restart the whole group to admit it. Before it
joins, the agent looks for a running round instead:

1. the rendezvous store says where the running round hosts its worker store (launch/rendezvous/arrival.py);
2. the group's in-place board there says which nodes the group holds since it last shrank or grew;
3. the pure policy (:func:`~stalwart.policy.inplace.offer`) says whether to offer a free place; the
   agent writes its offer and waits, bounded by ``--in-place-announce-timeout``, for the group's
   first node to invite it (policy :func:`~stalwart.policy.inplace.grow`): the next generation and
   the group's nodes in it, this one included.

Invited, the node starts its ranks in that generation at its place (the job runner's take-over
path, as a hot spare's) while the group trains on; once its ranks are about to join, its agent says
so on the board, and the first node announces the generation: the group's ranks keep their
processes, re-form at the next step boundary and send the newcomer's ranks the live state. Not taken in (no running round, the group has not
shrunk, it is full, no answer in time), the agent withdraws its offer and joins the rendezvous as
before. Every store call runs on the board's thread or under the store timeout; the waits are
bounded and take their time from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from typing_extensions import assert_never

from ...policy.inplace import Offer, OfferCase, Refuse, offer
from ...policy.world_size import WorldPlan
from ..clock import Clock
from ..ports import Round
from ..rendezvous.node_rendezvous import listening
from .board import POLL_S, Announcement, StoreBoard


@dataclass(frozen=True)
class Place:
    """The place the group's first node gave this node: where its ranks start, in which generation."""

    plan: WorldPlan
    met: Round
    generation: int
    reason: str


def find_place(cfg, rendezvous, clock: Clock, note: Callable[[str], None], board_for=None) -> Place | None:
    """Offer this node to a running group that shrank in place; its place once taken in, else None."""
    where = rendezvous.workers_elsewhere()
    if where is None:
        return None
    addr, port = where
    probe_s = min(5.0, float(cfg.rendezvous.store_timeout_s) / 2)
    if board_for is None:
        if not listening(addr, port, min(1.0, probe_s)):
            return None  # that round is over (its store went with its first node)
        board_for = lambda: StoreBoard(  # noqa: E731 - one use
            addr, port, cfg.rendezvous.store_timeout_s, note, node=cfg.node_name, signer=rendezvous.signer
        )
    board = board_for()
    try:
        return _offer(cfg, board, clock, note, probe_s, Round(0, (), addr, port))
    finally:
        board.close()


def _offer(cfg, board, clock: Clock, note: Callable[[str], None], probe_s: float, met: Round) -> Place | None:
    me = cfg.node_name
    until = clock.monotonic() + probe_s
    while not board.answered and clock.monotonic() < until:
        clock.sleep(POLL_S)
    if not board.answered:
        return None
    group = board.group()
    choice = offer(
        OfferCase(
            enabled=cfg.reform.enabled,
            node=me,
            active=group.active if group is not None else (),
            world_size=group.world_size if group is not None else 0,
            max_nodes=cfg.max_nodes,
        )
    )
    match choice:
        case Refuse(reason=reason):
            if group is not None:  # a running group that resized: say why this node does not offer
                note(reason)
            return None
        case Offer(reason=reason):
            assert group is not None
            note(reason)
        case _:
            assert_never(choice)
    # an invitation already in the store is an earlier one, given up (every new one takes a newer
    # generation): only one written after this offer takes this node in
    earlier = board.invited()
    since = max(group.generation, earlier.generation if earlier is not None else 0)
    board.offer(me)
    bound = float(cfg.reform.announce_s)
    until = clock.monotonic() + bound
    while True:
        place = _taken(board.invited(), since, me)
        if place is not None:
            return _place(cfg, place, met)
        if clock.monotonic() >= until:
            break
        clock.sleep(POLL_S)
    board.withdraw(me)
    clock.sleep(3 * POLL_S)  # the board's thread writes the withdrawal before it is closed
    place = _taken(board.invited(), since, me)  # invited just before the withdrawal
    if place is not None:
        return _place(cfg, place, met)
    note(f"the group did not take node {me} in within {bound:g}s: joining the rendezvous")
    return None


def _taken(seen: Announcement | None, since: int, me: str) -> Announcement | None:
    """The invitation that takes ``me`` in: newer than ``since``, with ``me`` among its nodes."""
    if seen is None or seen.generation <= since or not seen.world_size or me not in seen.active:
        return None
    return seen


def _place(cfg, a: Announcement, met: Round) -> Place:
    me = cfg.node_name
    reason = (
        f"node {a.node} took node {me} back into the group in place: its ranks start as group rank "
        f"{a.active.index(me)} of {len(a.active)} ({a.world_size} processes) in generation {a.generation}, "
        "with the live state from a replica"
    )
    plan = WorldPlan(a.active, (), cfg.nproc_per_node, reason)
    return Place(plan, Round(a.active.index(me), a.active, met.addr, met.port), a.generation, reason)
