"""The in-place recovery machine: its phases, the one frozen state, the legal moves and the pure step.

One node's agent is in exactly one :class:`Phase`. The moves between phases are data
(:data:`TRANSITIONS`: ``(phase, trigger kind) -> phase``), so "what happens when a node returns while
the group shrinks?" is answered by reading the table (or its rendering, :func:`render_table`, which
docs/fast-recovery.md shows). :func:`step` applies one trigger to an :class:`InPlaceState` and
returns the next state, or :class:`Illegal` with the reason when the table has no such move.

The state is frozen and changes only by :func:`dataclasses.replace` inside :func:`step`. Fields that
only one phase gives a meaning carry it in their comment, and :func:`step` clears them when the phase
changes. Nothing here does I/O: the executor (launch/inplace/recovery.py) decides with the pure policies,
steps the machine and then acts (control block, board, ledger).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from typing_extensions import assert_never

from ...policy.inplace import InPlace
from ..decision import Decision
from .board_records import Announcement


class Phase(Enum):
    IDLE = "idle"  # the group trains; no re-formation under way
    REPLACING = "replacing"  # this node replaced failed local ranks; the re-formation is pending
    FOLLOWING = "following"  # another node announced a generation; the local ranks re-form into it
    WAITING = "waiting"  # a local rank lost a peer; the board knows; an announcement is awaited
    REFUSED = "refused"  # no in-place recovery: the ranks were told, the whole group restarts
    SHRINKING = "shrinking"  # this (first) node announced a smaller group; its ranks re-form
    INVITING = "inviting"  # this (first) node invited newcomers; the group trains on meanwhile
    GROWING = "growing"  # this (first) node announced the grown group; its ranks re-form
    NEWCOMER_STARTING = "newcomer_starting"  # this node's ranks start in an invited generation
    TAKING_OVER = "taking_over"  # a hot spare's ranks start in a lost node's place


class Resize(Enum):
    SHRINK = "shrink"
    GROW = "grow"


class TriggerKind(Enum):
    REPLACED = "replaced"  # failed local ranks were replaced, the generation announced
    REFORMED = "reformed"  # every local rank joined the current generation
    REPLACE_FAILED = "replace_failed"  # a rank exited during the re-formation, or it timed out
    PEER_LOST = "peer_lost"  # a local rank waits for a generation nobody announced; board told
    JOINED = "joined"  # another node's announcement: the local ranks were asked to join it
    REFUSED = "refused"  # the ranks (and maybe the board) were told no re-formation is coming
    SHRUNK = "shrunk"  # this node announced the group without its lost node(s)
    INVITED = "invited"  # this node invited nodes that offered a place
    GROW_GIVEN_UP = "grow_given_up"  # the invitation ended without a grow
    GROWN = "grown"  # every newcomer was ready: this node announced the grown group
    NEWCOMER_STARTED = "newcomer_started"  # this node's ranks start in the generation invited to
    TAKEOVER_STARTED = "takeover_started"  # this spare's ranks start in a lost node's place
    READY_TOLD = "ready_told"  # this node told the first node its starting ranks are ready


@dataclass(frozen=True)
class Pending:
    """A re-formation of this node's own replacements (meaningful in REPLACING)."""

    decision: Decision  # the failure being recovered (the attempt's outcome if the rung fails)
    plan: InPlace
    started: float  # when the replacements were started
    deadline: float
    done_before: int  # the interrupted step: the lowest step not completed by every rank
    replace_s: float


@dataclass(frozen=True)
class Invitation:
    """A grow under way: the newcomers start their ranks in ``a.generation`` while the group trains on."""

    a: Announcement  # the group after the grow (announced once every newcomer's ranks are ready)
    joining: tuple[str, ...]
    old: int  # the world size before
    deadline: float  # on the agent's clock
    bound_s: float
    reason: str


@dataclass(frozen=True)
class Resized:
    """A resize this node announced (meaningful in SHRINKING and GROWING)."""

    kind: Resize
    old: int  # the world size before
    interrupted: int  # the lowest step not completed by every local rank when it was announced


@dataclass(frozen=True)
class Group:
    """The group's nodes by group rank and its world size (after a resize, the announced ones)."""

    active: tuple[str, ...]
    world_size: int


@dataclass(frozen=True)
class InPlaceState:
    phase: Phase = Phase.IDLE
    generation: int = 0  # the process group's current generation on this node
    used: int = 0  # re-formations of local replacements started in this attempt
    completed: int = 0  # failures recovered in place in this attempt
    invited: int = 0  # the newest generation this (first) node invited newcomers to
    active: tuple[str, ...] = ()  # the group's nodes by group rank
    world_size: int = 0  # every node's ranks (0: this node's are the whole group)
    num_nodes: int = 1
    spares: bool = False  # the round has hot spares
    given_up: tuple[tuple[str, int], ...] = ()  # (node, its offer whose invitation was given up)
    pending: Pending | None = None  # REPLACING
    invitation: Invitation | None = None  # INVITING
    since: float | None = None  # SHRINKING, GROWING, NEWCOMER_STARTING, TAKING_OVER: ranks asked to join
    resized: Resized | None = None  # SHRINKING, GROWING
    said_ready: bool = False  # NEWCOMER_STARTING, TAKING_OVER

    def gave_up(self, node: str) -> int | None:
        """The offer of ``node`` whose invitation was given up, if any."""
        return dict(self.given_up).get(node)

    @property
    def next_generation_base(self) -> int:
        """The generation a new decision counts from: past a grow's invitation, if any."""
        return max(self.generation, self.invited)


# the phases in which the local ranks re-form into a generation this node did not replace ranks for
JOINING = frozenset({Phase.SHRINKING, Phase.GROWING, Phase.NEWCOMER_STARTING, Phase.TAKING_OVER})
# where a failure of the local ranks may be replaced in place (not during its own re-formation; an
# invitation is given up first)
_REPLACEABLE = (Phase.IDLE, Phase.WAITING, Phase.FOLLOWING, *sorted(JOINING, key=lambda p: p.value))
_REFORMING = (Phase.REPLACING, Phase.FOLLOWING, *sorted(JOINING, key=lambda p: p.value))

_P, _T = Phase, TriggerKind
TRANSITIONS: dict[tuple[Phase, TriggerKind], Phase] = {
    **{(p, _T.REPLACED): _P.REPLACING for p in _REPLACEABLE},
    **{(p, _T.REFORMED): _P.IDLE for p in _REFORMING},
    (_P.REPLACING, _T.REPLACE_FAILED): _P.IDLE,
    **{(p, _T.PEER_LOST): _P.WAITING for p in _REPLACEABLE if p is not _P.WAITING},
    **{(p, _T.JOINED): _P.FOLLOWING for p in _REPLACEABLE},
    **{(p, _T.REFUSED): _P.REFUSED for p in Phase if p is not _P.REFUSED},
    **{(p, _T.SHRUNK): _P.SHRINKING for p in _REPLACEABLE},
    (_P.IDLE, _T.INVITED): _P.INVITING,
    (_P.FOLLOWING, _T.INVITED): _P.INVITING,
    (_P.INVITING, _T.GROW_GIVEN_UP): _P.IDLE,
    (_P.INVITING, _T.GROWN): _P.GROWING,
    (_P.IDLE, _T.NEWCOMER_STARTED): _P.NEWCOMER_STARTING,
    (_P.IDLE, _T.TAKEOVER_STARTED): _P.TAKING_OVER,
    (_P.NEWCOMER_STARTING, _T.READY_TOLD): _P.NEWCOMER_STARTING,
    (_P.TAKING_OVER, _T.READY_TOLD): _P.TAKING_OVER,
}


# --- the triggers: one class per kind, carrying what the move changes --------------------------------


@dataclass(frozen=True)
class Replaced:
    pending: Pending
    kind: TriggerKind = TriggerKind.REPLACED


@dataclass(frozen=True)
class Reformed:
    kind: TriggerKind = TriggerKind.REFORMED


@dataclass(frozen=True)
class ReplaceFailed:
    kind: TriggerKind = TriggerKind.REPLACE_FAILED


@dataclass(frozen=True)
class PeerLost:
    kind: TriggerKind = TriggerKind.PEER_LOST


@dataclass(frozen=True)
class Joined:
    generation: int
    group: Group | None = None  # the announced group when it resized with this node in it
    kind: TriggerKind = TriggerKind.JOINED


@dataclass(frozen=True)
class Refused:
    kind: TriggerKind = TriggerKind.REFUSED


@dataclass(frozen=True)
class Shrunk:
    generation: int
    group: Group
    resized: Resized
    since: float
    kind: TriggerKind = TriggerKind.SHRUNK


@dataclass(frozen=True)
class Invited:
    invitation: Invitation
    kind: TriggerKind = TriggerKind.INVITED


@dataclass(frozen=True)
class GrowGivenUp:
    offers: tuple[tuple[str, int], ...]  # each newcomer and its offer, never invited again
    kind: TriggerKind = TriggerKind.GROW_GIVEN_UP


@dataclass(frozen=True)
class Grown:
    generation: int
    group: Group
    resized: Resized
    since: float
    kind: TriggerKind = TriggerKind.GROWN


@dataclass(frozen=True)
class NewcomerStarted:
    generation: int
    since: float
    kind: TriggerKind = TriggerKind.NEWCOMER_STARTED


@dataclass(frozen=True)
class TakeoverStarted:
    generation: int
    since: float
    kind: TriggerKind = TriggerKind.TAKEOVER_STARTED


@dataclass(frozen=True)
class ReadyTold:
    kind: TriggerKind = TriggerKind.READY_TOLD


Trigger = (
    Replaced
    | Reformed
    | ReplaceFailed
    | PeerLost
    | Joined
    | Refused
    | Shrunk
    | Invited
    | GrowGivenUp
    | Grown
    | NewcomerStarted
    | TakeoverStarted
    | ReadyTold
)


@dataclass(frozen=True)
class Illegal:
    reason: str


def allows(phase: Phase, kind: TriggerKind) -> bool:
    return (phase, kind) in TRANSITIONS


def step(state: InPlaceState, trigger: Trigger) -> InPlaceState | Illegal:
    """The state after ``trigger``, or why the table has no such move from ``state.phase``."""
    to = TRANSITIONS.get((state.phase, trigger.kind))
    if to is None:
        return Illegal(f"no move on {trigger.kind.value} from phase {state.phase.value}")
    s = state
    if to is not state.phase:  # the fields the old phase made meaningful mean nothing now
        s = dataclasses.replace(s, pending=None, invitation=None, since=None, resized=None, said_ready=False)
    s = dataclasses.replace(s, phase=to)
    return _effect(state, s, trigger)


def _resize(s: InPlaceState, generation: int, group: Group) -> InPlaceState:
    return dataclasses.replace(
        s,
        generation=generation,
        active=group.active,
        world_size=group.world_size,
        num_nodes=len(group.active),
    )


def _effect(before: InPlaceState, s: InPlaceState, t: Trigger) -> InPlaceState:  # noqa: C901 - one arm a kind
    match t:
        case Replaced(pending=p):
            return dataclasses.replace(s, pending=p, generation=p.plan.generation, used=s.used + 1)
        case Reformed():
            # a failure recovered here or by a spare taking a place; a grow or a joined generation recovers
            # none on this node (the node that replaced the ranks counts its own)
            counts = before.phase in (Phase.REPLACING, Phase.SHRINKING, Phase.TAKING_OVER)
            return dataclasses.replace(s, completed=s.completed + counts)
        case ReplaceFailed() | PeerLost() | Refused():
            return s
        case Joined(generation=gen, group=group):
            return _resize(s, gen, group) if group is not None else dataclasses.replace(s, generation=gen)
        case (
            Shrunk(generation=gen, group=group, resized=r, since=since)
            | Grown(generation=gen, group=group, resized=r, since=since)
        ):
            return dataclasses.replace(_resize(s, gen, group), resized=r, since=since)
        case Invited(invitation=inv):
            return dataclasses.replace(s, invitation=inv, invited=inv.a.generation)
        case GrowGivenUp(offers=offers):
            return dataclasses.replace(
                s, given_up=(*[g for g in s.given_up if g[0] not in dict(offers)], *offers)
            )
        case NewcomerStarted(generation=gen, since=since) | TakeoverStarted(generation=gen, since=since):
            return dataclasses.replace(s, generation=gen, since=since)
        case ReadyTold():
            return dataclasses.replace(s, said_ready=True)
        case _:
            assert_never(t)


def render_table() -> str:
    """The transition table as a markdown table, one row a phase: each trigger and where it leads."""
    rows = ["| phase | trigger | next phase |", "|---|---|---|"]
    for phase in Phase:
        for kind in TriggerKind:
            to = TRANSITIONS.get((phase, kind))
            if to is not None:
                rows.append(f"| {phase.value} | {kind.value} | {to.value} |")
    return "\n".join(rows)


def render_mermaid() -> str:
    """The transition table as a mermaid ``stateDiagram-v2``; moves into REFUSED are folded into one
    line (every phase but REFUSED itself has one)."""
    lines = ["stateDiagram-v2", f"    [*] --> {Phase.IDLE.value}"]
    for (phase, kind), to in TRANSITIONS.items():
        if kind is TriggerKind.REFUSED:
            continue
        lines.append(f"    {phase.value} --> {to.value}: {kind.value}")
    lines.append(f"    note right of {Phase.REFUSED.value}: every other phase moves here on refused")
    return "\n".join(lines)
