"""The recovery ladder's first rung: may a failure be recovered in place?

In place means: the failed ranks are replaced (warm, from the fork server), the survivors keep their
processes, leave the broken process group, join a new generation with the replacements and hand
them the live state of the last completed step (docs/fast-recovery.md). When the answer is no, the
failure goes down the ladder: a whole-group restart (warm from the fork server, cold when that
fails), decided by the job policy (policy/job.py) as before.

:func:`decide` is pure: the supervisor gathers an :class:`InPlaceCase`, applies the decision and
records its reason in the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..terminal import plural
from .membership import Change, MembershipView, Role, lost_nodes, next_group
from .vocabulary import FailureKind
from .world_size import SizeRule

# failures a re-formed group can recover from: a lost or stuck rank, not the script's own error
RECOVERABLE = frozenset({FailureKind.CRASH, FailureKind.HANG, FailureKind.PEER_LOST})


@dataclass(frozen=True)
class InPlaceCase:
    enabled: bool  # --in-place
    failure: FailureKind
    failed: frozenset[int]  # the ranks to replace
    ranks: frozenset[int]  # every rank of the group
    in_place_ranks: frozenset[int]  # ranks whose script runs under Session.run
    num_nodes: int
    used: int  # in-place recoveries already done in this attempt
    allowed: int  # --in-place-max
    generation: int  # the process group's current generation
    reforming: bool = False  # a re-formation is still in progress (a second failure during it)
    stopping: bool = False  # a stop was requested (preemption): save, do not re-form
    forced_failure: bool = False  # chaos: this attempt's in-place rung must fail
    xids: tuple[str, ...] = ()  # severe Xids this node's GPUs reported since the attempt started
    world_size: int = 0  # every node's ranks (0: this node's ``ranks`` are the whole group)


@dataclass(frozen=True)
class InPlace:
    ranks: frozenset[int]
    generation: int  # the generation the group re-forms into
    reason: str


@dataclass(frozen=True)
class NotInPlace:
    reason: str


InPlaceDecision = InPlace | NotInPlace


def not_offered(enabled: bool, failure: FailureKind, session: bool) -> NotInPlace | None:
    """Why in place is not taken when no rank offers it, with the fix; None where there is nothing to
    fix (in place is off, or the failure is the script's own and a restart is the answer anyway)."""
    if not enabled or failure not in RECOVERABLE:
        return None
    fix = "run the training function under Session.run (docs/fast-recovery.md)"
    if session:
        return NotInPlace(
            "the ranks run session.loop outside Session.run, so a failed rank cannot "
            f"be replaced while the others keep their state and the whole group restarts; to recover in "
            f"place, {fix}"
        )
    return NotInPlace(
        "the script does not run the SDK's Session, so a failed rank cannot be "
        f"replaced while the others keep their state and the whole group restarts; to recover in place, {fix}"
    )


def decide(case: InPlaceCase) -> InPlaceDecision:
    """Re-form in place, or say why the failure goes down the ladder (first reason that applies)."""
    failed = ", ".join(str(r) for r in sorted(case.failed))
    if not case.enabled:
        return NotInPlace("in-place recovery is off (--no-in-place)")
    if case.stopping:
        return NotInPlace("a stop was requested: the workers save and stop instead")
    if case.reforming:
        return NotInPlace(f"rank {failed} failed during an in-place re-formation")
    if case.failure not in RECOVERABLE:
        return NotInPlace(f"a {case.failure} is the script's own failure: replacing the rank would repeat it")
    if case.xids:
        return NotInPlace(
            f"{case.xids[0]} since the attempt started: a surviving rank may hold an unsound device, so "
            "the whole group restarts and the health gate re-checks the node first"
        )
    missing = sorted(case.ranks - case.in_place_ranks)
    if missing:
        shown = ", ".join(str(r) for r in missing[:8])
        return NotInPlace(
            f"rank {shown} does not run under Session.run, so its process group cannot be re-formed in place"
        )
    if case.num_nodes > 1 and case.failure is FailureKind.PEER_LOST:
        return NotInPlace(
            "the lost peer is on another node: that node's agent re-forms the group in place when it "
            "can (this node then joins), else the whole group restarts"
        )
    if case.num_nodes > 1 and case.failure is FailureKind.HANG:
        return NotInPlace(
            "a hang across nodes silences every node's ranks, and only the node of the stopped rank "
            "can pin it: the group restarts"
        )
    if not case.failed:
        return NotInPlace(
            "the hung rank cannot be told from the ranks waiting on it (none is stopped, silent to the stack "
            "request or outside the collective the others wait in)"
        )
    if len(case.failed) >= max(case.world_size, len(case.ranks)):  # other nodes' ranks survive too
        return NotInPlace("no rank survived to keep the live state")
    if case.used >= case.allowed:
        return NotInPlace(
            f"{case.used} in-place recoveries in this attempt reached --in-place-max {case.allowed}"
        )
    if case.forced_failure:
        return NotInPlace("in-place recovery forced to fail (chaos)")
    survivors = len(case.ranks) - len(case.failed)
    kept = (
        "the surviving ranks of every node keep their processes"
        if case.num_nodes != 1
        else f"{plural(survivors, 'surviving rank')} {'keeps its process' if survivors == 1 else 'keep their processes'}"
    )
    return InPlace(
        case.failed,
        case.generation + 1,
        f"rank {failed} ({case.failure}) replaced in place; {kept} and hand over "
        f"the live state (generation {case.generation + 1})",
    )


@dataclass(frozen=True)
class JoinCase:
    """What a node's agent knows when another node may be re-forming the group in place."""

    enabled: bool  # --in-place
    generation: int  # this node's current generation
    announced: int  # the newest generation another node's agent announced (0: none)
    announced_by: str  # that node
    waiting_since: float | None  # when a local rank first left its group for a newer generation
    now: float
    bound_s: float  # how long local ranks may wait for an announcement (--in-place-announce-timeout)
    busy: bool  # this node's own re-formation is in progress
    stopping: bool  # a stop was requested
    refused_by: str = ""  # a node whose agent said the failure is not recovered in place
    refused_why: str = ""
    lost: tuple[str, ...] = ()  # other active nodes whose heartbeat has been silent past half the bound
    spares: bool = False  # the round has hot spares (one may take a lost node's place)
    shrunk_to: int = 0  # the announced generation shrinks the group to this world size (0: it does not)
    grown_to: int = 0  # the announced generation grows the group back to this world size (0: it does not)


@dataclass(frozen=True)
class Join:
    generation: int
    reason: str


@dataclass(frozen=True)
class Refuse:
    reason: str


@dataclass(frozen=True)
class Wait:
    pass


JoinDecision = Join | Refuse | Wait


def join(case: JoinCase) -> JoinDecision:
    """On a node that replaced none of its own ranks: join another node's in-place re-formation, keep
    waiting for one (bounded), or tell the local ranks none is coming (they exit with their
    communication error and the group restarts whole)."""
    if case.busy:
        return Wait()
    if case.announced > case.generation:
        if case.stopping or not case.enabled:
            why = "a stop was requested" if case.stopping else "in-place recovery is off here"
            return Refuse(f"node {case.announced_by} re-forms in place, but {why}: the group restarts")
        if case.grown_to:
            return Join(
                case.announced,
                f"node {case.announced_by} grew the group back in place to {plural(case.grown_to, 'process', 'processes')} (a "
                f"node returned); this node's ranks keep their processes and join generation "
                f"{case.announced} at the next step boundary",
            )
        if case.shrunk_to:
            return Join(
                case.announced,
                f"node {case.announced_by} shrank the group in place to {plural(case.shrunk_to, 'process', 'processes')} (a lost "
                f"node, no hot spare); this node's ranks keep their processes and join generation "
                f"{case.announced} in their new places",
            )
        return Join(
            case.announced,
            f"node {case.announced_by} started the replacements of the failed ranks in place; this "
            f"node's ranks keep their processes and join generation {case.announced}",
        )
    if case.refused_by:  # its ranks are going: waiting for an announcement would only delay the restart
        return Refuse(
            f"node {case.refused_by} does not re-form in place ({case.refused_why}): the group restarts"
        )
    if case.waiting_since is None:
        return Wait()
    if not case.enabled or case.stopping:
        return Refuse("no in-place re-formation here: the ranks that lost a peer exit and the group restarts")
    if case.lost and not case.spares:
        return Refuse(
            f"node {', '.join(case.lost)} is lost (no heartbeat) and the round has no hot spare to take its "
            "place: the group restarts"
        )
    if case.now - case.waiting_since >= case.bound_s:
        return Refuse(
            f"a rank lost a peer and no node announced an in-place re-formation within {case.bound_s:g}s "
            "(a lost node, or a failure its agent cannot replace): the group restarts"
        )
    return Wait()


@dataclass(frozen=True)
class TakeOverCase:
    """What a hot spare's agent knows of the active nodes while it stands by."""

    enabled: bool  # --in-place
    spare: str  # this node
    spares: tuple[str, ...]  # the round's hot spares, in the plan's order
    active: tuple[str, ...]  # the active nodes by group rank
    silent: dict[str, float]  # seconds since each active node's heartbeat last moved
    waiting: frozenset[str]  # active nodes whose ranks wait for a generation nobody announced
    bound_s: float  # silence after which a node counts as lost
    dead: frozenset[str] = frozenset()  # active nodes whose agent process is gone (no bound to wait out)
    left: frozenset[str] = frozenset()  # of ``dead``: those whose agent left the job on purpose


@dataclass(frozen=True)
class TakeOver:
    lost: str
    group_rank: int  # the lost node's place, which this spare takes
    reason: str


TakeOverDecision = TakeOver | Wait


def take_over(case: TakeOverCase) -> TakeOverDecision:
    """Whether this hot spare takes a lost node's place in place: the node's heartbeat is silent past
    the bound *and* the ranks of another node wait for a re-formation nobody announced (a slow agent
    whose ranks still train is never replaced). Lost nodes go to spares in order, one each, so every
    spare reaches the same pairing from the same view; the claim in the store settles the rest."""
    view = MembershipView(
        Role.SPARE,
        case.spare,
        case.active,
        enabled=case.enabled,
        lost=lost_nodes(case.active, case.silent, case.bound_s, case.waiting, case.dead),
        silent=case.silent,
        dead=case.dead,
        left=case.left,
        spares=case.spares,
        waiting=case.waiting,
    )
    got = next_group(view)
    if got.change is not Change.TAKE_OVER:
        return Wait()
    lost = got.lost[0]
    return TakeOver(lost, case.active.index(lost), got.reason)


@dataclass(frozen=True)
class ShrinkCase:
    """What the node that watches the others' heartbeats knows when some of them fell silent."""

    enabled: bool  # --in-place
    stopping: bool  # a stop was requested
    node: str  # this node
    active: tuple[str, ...]  # the group's nodes by group rank
    lost: tuple[str, ...]  # active nodes whose heartbeat has been silent past half the bound, or dead
    spares: bool  # the round has hot spares (one takes a lost node's place instead)
    nproc_per_node: int
    min_nodes: int
    rule: SizeRule
    generation: int  # this node's current generation
    silent: dict[str, float] = field(default_factory=dict)  # seconds since each heartbeat moved
    dead: frozenset[str] = frozenset()  # lost nodes whose agent process is gone (connection closed)
    left: frozenset[str] = frozenset()  # of ``dead``: those whose agent left the job on purpose


@dataclass(frozen=True)
class ShrinkInPlace:
    active: tuple[str, ...]  # the surviving nodes, in their old order: new group rank = index
    world_size: int
    generation: int  # the generation the survivors re-form into
    reason: str


ShrinkDecision = ShrinkInPlace | Refuse | Wait


def shrink(case: ShrinkCase) -> ShrinkDecision:
    """A lost node and no hot spare: whether the surviving nodes re-form in place at a smaller world
    size (their ranks keep their processes and get new global ranks), decided only by the first
    surviving node, so that exactly one announces; or the reason the group restarts whole. Every
    survivor stays: when their count is no valid size, the whole-group restart re-plans (and may
    keep some as spares)."""
    view = MembershipView(
        Role.MEMBER,
        case.node,
        case.active,
        enabled=case.enabled,
        stopping=case.stopping,
        generation=case.generation,
        nproc_per_node=case.nproc_per_node,
        min_nodes=case.min_nodes,
        rule=case.rule,
        lost=case.lost,
        silent=case.silent,
        dead=case.dead,
        left=case.left,
        spares=("a hot spare",) if case.spares else (),  # which one does not matter here: it takes the place
    )
    got = next_group(view)
    match got.change:
        case Change.SHRINK:
            return ShrinkInPlace(got.members, got.world_size, got.generation, got.reason)
        case Change.RESTART:
            return Refuse(got.reason)
        case _:
            return Wait()


@dataclass(frozen=True)
class GrowCase:
    """What the first node of a group that shrank in place knows when nodes offer to return."""

    enabled: bool  # --in-place
    stopping: bool  # a stop was requested
    busy: bool  # a re-formation is in progress, or some rank waits for one (an incident)
    node: str  # this node
    active: tuple[str, ...]  # the group's nodes by group rank
    offers: tuple[str, ...]  # nodes that offered to take a free place, in the order they offered
    nproc_per_node: int
    max_nodes: int
    rule: SizeRule
    generation: int  # this node's current generation


@dataclass(frozen=True)
class GrowInPlace:
    active: tuple[str, ...]  # the old nodes in their places, then the newcomers: new group rank = index
    joining: tuple[str, ...]  # the newcomers
    world_size: int
    generation: int
    reason: str


GrowDecision = GrowInPlace | Wait


def grow(case: GrowCase) -> GrowDecision:
    """Whether the group takes returning nodes back in place: the old nodes keep their processes and
    places, the newcomers take the next group ranks, and every rank re-forms at the next step boundary
    with the live state sent to the newcomers by a replica. Only the first node decides (exactly one
    announces); it takes as many of the offers, in order, as give the largest size that
    ``--nnodes MAX`` and ``--valid-sizes`` allow. Otherwise it waits: a newcomer nobody takes in
    joins the rendezvous after its own bound, and the whole group restarts with it there."""
    view = MembershipView(
        Role.MEMBER,
        case.node,
        case.active,
        enabled=case.enabled,
        stopping=case.stopping,
        busy=case.busy,
        generation=case.generation,
        nproc_per_node=case.nproc_per_node,
        max_nodes=case.max_nodes,
        rule=case.rule,
        offers=case.offers,
    )
    got = next_group(view)
    if got.change is not Change.GROW:
        return Wait()
    return GrowInPlace(got.members, got.joining, got.world_size, got.generation, got.reason)


@dataclass(frozen=True)
class OfferCase:
    """What a node that arrives while the job runs knows of the group (its first node's record)."""

    enabled: bool  # --in-place
    node: str  # this node
    active: tuple[str, ...]  # the group's nodes, as its first node last recorded them (() : unknown)
    world_size: int
    max_nodes: int


@dataclass(frozen=True)
class Offer:
    reason: str


OfferDecision = Offer | Refuse


def offer(case: OfferCase) -> OfferDecision:
    """Whether a node that arrives during the job offers to take a free place in the running group (it
    then waits, bounded, for the group's first node to take it in), or joins the rendezvous as before
    (the reason says why)."""
    view = MembershipView(
        Role.ARRIVING,
        case.node,
        case.active,
        enabled=case.enabled,
        max_nodes=case.max_nodes,
        world_size=case.world_size,
    )
    got = next_group(view)
    if got.change is Change.OFFER:
        return Offer(got.reason)
    return Refuse(got.reason)
