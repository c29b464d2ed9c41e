"""The next group of an in-place recovery across nodes, from heartbeats and offers (one function).

:func:`next_group` is to the in-place machine what TorchFT's ``quorum_compute`` is to its quorum: a
pure function of what one node's agent sees (a :class:`MembershipView`: the group's nodes, which of
them fell silent, which wait, which spares stand by, which nodes offer a free place) that returns the
next :class:`Membership` (its nodes, generation, the :class:`Change` and the reason). A shrink, a
grow, a hot spare's take-over and a returning node's offer are its views, seen from the node's
:class:`Role`; policy/inplace.py keeps them as thin functions over it (``shrink``, ``grow``,
``take_over``, ``offer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from typing_extensions import assert_never

from ..terminal import plural
from .world_size import SizeRule


class Role(Enum):
    MEMBER = "member"  # a node of the running group
    SPARE = "spare"  # a hot spare standing by
    ARRIVING = "arriving"  # a node that starts while the job runs


class Change(Enum):
    KEEP = "keep"  # nothing to change from this node (or another node decides)
    SHRINK = "shrink"  # the surviving nodes re-form without the lost ones
    GROW = "grow"  # nodes that offered are taken in at the next group ranks
    TAKE_OVER = "take_over"  # this spare takes a lost node's place
    OFFER = "offer"  # this arriving node offers to take a free place
    RESTART = "restart"  # no in-place change: the group restarts whole (or this node joins the rendezvous)


@dataclass(frozen=True)
class MembershipView:
    role: Role
    node: str  # this node
    active: tuple[str, ...]  # the group's nodes by group rank
    enabled: bool = True  # --in-place
    stopping: bool = False  # a stop was requested
    busy: bool = False  # a re-formation is in progress, or some rank waits for one
    generation: int = 0  # this node's current generation
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    rule: SizeRule | None = None  # the valid world sizes (None: any)
    lost: tuple[str, ...] = ()  # active nodes counted lost (their heartbeat silent past the bound)
    silent: Mapping[str, float] = field(default_factory=dict)  # seconds since each heartbeat moved
    dead: frozenset[str] = frozenset()  # active nodes whose agent process is gone (its connection closed)
    left: frozenset[str] = frozenset()  # of ``dead``: those whose agent left the job on purpose
    spares: tuple[str, ...] = ()  # the round's hot spares, in the plan's order
    waiting: frozenset[str] = frozenset()  # active nodes whose ranks wait for an unannounced generation
    offers: tuple[str, ...] = ()  # nodes that offered a free place, in the order they offered
    world_size: int = 0  # the running group's processes (an arriving node's view)


@dataclass(frozen=True)
class Membership:
    change: Change
    members: tuple[str, ...] = ()  # the next group's nodes by group rank (KEEP, RESTART: unchanged)
    generation: int = 0  # the generation they re-form into
    reason: str = ""
    world_size: int = 0
    lost: tuple[str, ...] = ()  # the nodes dropped (SHRINK) or whose place is taken (TAKE_OVER)
    joining: tuple[str, ...] = ()  # the nodes taken in (GROW)


KEEP = Membership(Change.KEEP)


def lost_nodes(
    active: tuple[str, ...],
    silent: Mapping[str, float],
    bound_s: float,
    waiting: frozenset[str] = frozenset(),
    dead: frozenset[str] = frozenset(),
) -> tuple[str, ...]:
    """The active nodes whose heartbeat has been silent for ``bound_s``, or whose agent process is
    gone (the kernel closed its connection: no bound to wait out), and whose ranks do not wait (a node
    whose ranks wait is alive: its agent wrote that)."""
    return tuple(n for n in active if (n in dead or silent.get(n, 0.0) >= bound_s) and n not in waiting)


def why_lost(
    node: str, silent: Mapping[str, float], dead: frozenset[str], left: frozenset[str] = frozenset()
) -> str:
    """How ``node`` is known to be lost, for a decision's reason."""
    if node in left:
        return "its agent left the job on purpose: it excluded its own node"
    if node in dead:
        return "its agent's process is gone: its liveness connection closed"
    return f"no heartbeat for {silent.get(node, 0.0):.1f}s"


def next_group(view: MembershipView) -> Membership:
    """The next group as this node sees it, and the reason (first rule that applies)."""
    match view.role:
        case Role.SPARE:
            return _take_over(view)
        case Role.ARRIVING:
            return _offer(view)
        case Role.MEMBER:
            return _shrink(view) if view.lost else _grow(view)
        case _:
            assert_never(view.role)


def _valid(view: MembershipView, world: int) -> bool:
    return view.rule is None or view.rule.valid(world)


def _shrink(v: MembershipView) -> Membership:
    lost = tuple(n for n in v.active if n in v.lost)
    survivors = tuple(n for n in v.active if n not in v.lost)
    if not lost or v.spares or not survivors or survivors[0] != v.node:
        return KEEP  # nothing lost, a spare takes the place, or another node decides
    gone = ", ".join(lost)
    if not v.enabled or v.stopping:
        why = "a stop was requested" if v.stopping else "in-place recovery is off (--no-in-place)"
        return Membership(Change.RESTART, reason=f"node {gone} is lost, but {why}: the group restarts")
    old, world = len(v.active) * v.nproc_per_node, len(survivors) * v.nproc_per_node
    if len(survivors) < v.min_nodes:
        return Membership(
            Change.RESTART,
            reason=f"node {gone} is lost and the round has no hot spare; {len(survivors)} surviving node(s) "
            f"are fewer than the minimum of {v.min_nodes}: the group restarts",
        )
    if not _valid(v, world):
        assert v.rule is not None
        return Membership(
            Change.RESTART,
            reason=f"node {gone} is lost and the round has no hot spare; {plural(len(survivors), 'surviving node')} "
            f"x {v.nproc_per_node} = {plural(world, 'process', 'processes')} is not {v.rule.describe()}: the group restarts at the "
            "next valid size",
        )
    gen = v.generation + 1
    return Membership(
        Change.SHRINK,
        survivors,
        gen,
        f"node {gone} is lost ({'; '.join(why_lost(n, v.silent, v.dead, v.left) for n in lost)}) and the round "
        f"has no hot spare: {'the surviving node re-forms' if len(survivors) == 1 else f'the {len(survivors)} surviving nodes re-form'} "
        f"in place, shrinking the world from {old} to {plural(world, 'process', 'processes')}; "
        f"their ranks keep their processes (generation {gen})",
        world,
        lost=lost,
    )


def _grow(v: MembershipView) -> Membership:
    offers = tuple(n for n in dict.fromkeys(v.offers) if n not in v.active)
    if not v.enabled or v.stopping or v.busy or not offers or not v.active or v.active[0] != v.node:
        return KEEP
    room = min(len(offers), v.max_nodes - len(v.active))
    take = next((k for k in range(room, 0, -1) if _valid(v, (len(v.active) + k) * v.nproc_per_node)), 0)
    if not take:
        return KEEP
    joining = offers[:take]
    members = (*v.active, *joining)
    old, world = len(v.active) * v.nproc_per_node, len(members) * v.nproc_per_node
    gen = v.generation + 1
    return Membership(
        Change.GROW,
        members,
        gen,
        f"node {', '.join(joining)} offered to return: the group grows back in place from {old} to {world} "
        f"processes at the next step boundary; the {len(v.active)} node(s) in it keep their processes "
        f"and places, and a replica sends the newcomers the live state (generation {gen})",
        world,
        joining=joining,
    )


def _take_over(v: MembershipView) -> Membership:
    """Lost nodes go to spares in order, one each, so every spare reaches the same pairing from the
    same view; the claim in the store settles the rest. A slow agent whose ranks still train is never
    replaced: some other node's ranks must wait."""
    if not v.enabled or not v.waiting:
        return KEEP
    pairs = dict(zip(sorted(v.spares), sorted(v.lost), strict=False))
    mine = pairs.get(v.node)
    if mine is None:
        return KEEP
    waiting = ", ".join(sorted(v.waiting))
    return Membership(
        Change.TAKE_OVER,
        tuple(v.node if n == mine else n for n in v.active),
        v.generation + 1,
        f"node {mine} is lost ({why_lost(mine, v.silent, v.dead, v.left)}; the ranks of {waiting} wait): "
        f"hot spare {v.node} takes its place in place, the other nodes' ranks keep their processes",
        v.world_size,
        lost=(mine,),
    )


def _offer(v: MembershipView) -> Membership:
    def rendezvous(why: str) -> Membership:
        return Membership(Change.RESTART, reason=f"{why}: joining the rendezvous")

    if not v.enabled:
        return rendezvous("in-place recovery is off (--no-in-place)")
    if not v.active:
        return rendezvous("the running group has not shrunk in place")
    if v.node in v.active:
        return rendezvous(f"node {v.node} is already in the running group")
    if len(v.active) >= v.max_nodes:
        return rendezvous(f"the running group already has --nnodes MAX {v.max_nodes} nodes")
    return Membership(
        Change.OFFER,
        (*v.active, v.node),
        v.generation + 1,
        f"the running group has {len(v.active)} of at most {v.max_nodes} nodes ({v.world_size} "
        f"processes): node {v.node} offers to take a free place in place",
        v.world_size,
        joining=(v.node,),
    )
