"""The in-place machine (launch/inplace/machine.py): every move in the table, every pair outside it
refused, the fields each phase makes meaningful, and the table's rendering; the membership function
(policy/membership.py) behind shrink, grow, take-over and offer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stalwart.launch.clock import ManualClock
from stalwart.launch.decision import AttemptOutcome, Decision, DecisionKind
from stalwart.launch.inplace.board_records import Announcement
from stalwart.launch.inplace.machine import (
    JOINING,
    TRANSITIONS,
    Group,
    GrowGivenUp,
    Grown,
    Illegal,
    InPlaceState,
    Invitation,
    Invited,
    Joined,
    NewcomerStarted,
    PeerLost,
    Pending,
    Phase,
    ReadyTold,
    Reformed,
    Refused,
    Replaced,
    ReplaceFailed,
    Resize,
    Resized,
    Shrunk,
    TakeoverStarted,
    Trigger,
    TriggerKind,
    render_mermaid,
    render_table,
    step,
)
from stalwart.policy.inplace import InPlace
from stalwart.policy.job import AttemptStatus
from stalwart.policy.membership import Change, MembershipView, Role, lost_nodes, next_group
from stalwart.policy.restart_policy import Failure
from stalwart.policy.world_size import SizeRule

CLOCK = ManualClock()
NOW = CLOCK.now()
GROWN = Announcement(3, "n0", (4, 5), 6, ("n0", "n1", "n2"))
FAILED = AttemptOutcome(AttemptStatus.FAILED, failure=Failure("crash", 0, 17, 2, "killed"), detected_at=NOW)
CRASH = Decision(DecisionKind.CRASH, "rank 2 died", outcome=FAILED, rank=2)
PENDING = Pending(CRASH, InPlace(frozenset({2}), 3, "r"), NOW, NOW + 9, 5, 0.1)
INVITATION = Invitation(GROWN, ("n2",), 4, NOW + 30, 30.0, "grow")


def _trigger(kind: TriggerKind) -> Trigger:
    """One trigger of each kind, with a payload that is easy to see in the next state."""
    group = Group(("n0", "n2"), 4)
    match kind:
        case TriggerKind.REPLACED:
            return Replaced(PENDING)
        case TriggerKind.REFORMED:
            return Reformed()
        case TriggerKind.REPLACE_FAILED:
            return ReplaceFailed()
        case TriggerKind.PEER_LOST:
            return PeerLost()
        case TriggerKind.JOINED:
            return Joined(3, group)
        case TriggerKind.REFUSED:
            return Refused()
        case TriggerKind.SHRUNK:
            return Shrunk(3, group, Resized(Resize.SHRINK, 6, 17), NOW)
        case TriggerKind.INVITED:
            return Invited(INVITATION)
        case TriggerKind.GROW_GIVEN_UP:
            return GrowGivenUp((("n2", 1),))
        case TriggerKind.GROWN:
            return Grown(3, Group(GROWN.active, 6), Resized(Resize.GROW, 4, 17), NOW)
        case TriggerKind.NEWCOMER_STARTED:
            return NewcomerStarted(3, NOW)
        case TriggerKind.TAKEOVER_STARTED:
            return TakeoverStarted(3, NOW)
        case TriggerKind.READY_TOLD:
            return ReadyTold()
    raise AssertionError(kind)


def _in(phase: Phase) -> InPlaceState:
    """A state in ``phase`` with the fields that phase makes meaningful filled in."""
    s = InPlaceState(phase=phase, generation=2, active=("n0", "n1", "n2"), world_size=6, num_nodes=3)
    if phase is Phase.REPLACING:
        s = dataclasses.replace(s, pending=PENDING)
    if phase is Phase.INVITING:
        s = dataclasses.replace(s, invitation=INVITATION, invited=3)
    if phase in JOINING:
        s = dataclasses.replace(s, since=NOW - 1)
    if phase in (Phase.SHRINKING, Phase.GROWING):
        kind = Resize.SHRINK if phase is Phase.SHRINKING else Resize.GROW
        s = dataclasses.replace(s, resized=Resized(kind, 6, 17))
    return s


def _meaningful(s: InPlaceState) -> None:
    """Each phase-bound field is set exactly in the phases that give it a meaning."""
    assert (s.pending is not None) == (s.phase is Phase.REPLACING)
    assert (s.invitation is not None) == (s.phase is Phase.INVITING)
    assert (s.since is not None) == (s.phase in JOINING)
    assert (s.resized is not None) == (s.phase in (Phase.SHRINKING, Phase.GROWING))
    assert not s.said_ready or s.phase in (Phase.NEWCOMER_STARTING, Phase.TAKING_OVER)


@pytest.mark.parametrize(("phase", "kind"), sorted(TRANSITIONS, key=lambda k: (k[0].value, k[1].value)))
def test_every_move_in_the_table_leads_where_the_table_says(phase, kind):
    before = _in(phase)
    after = step(before, _trigger(kind))
    assert isinstance(after, InPlaceState), after
    assert after.phase is TRANSITIONS[(phase, kind)]
    _meaningful(after)


ILLEGAL = sorted(
    ((p, k) for p in Phase for k in TriggerKind if (p, k) not in TRANSITIONS),
    key=lambda k: (k[0].value, k[1].value),
)


@pytest.mark.parametrize(("phase", "kind"), ILLEGAL)
def test_every_pair_outside_the_table_is_refused_with_a_reason(phase, kind):
    before = _in(phase)
    got = step(before, _trigger(kind))
    assert isinstance(got, Illegal)
    assert kind.value in got.reason and phase.value in got.reason


def test_the_table_covers_the_questions_it_is_for():
    # a node returns (an offer) while the group shrinks: no invitation until the shrink's ranks re-formed
    assert (Phase.SHRINKING, TriggerKind.INVITED) not in TRANSITIONS
    assert TRANSITIONS[(Phase.SHRINKING, TriggerKind.REFORMED)] is Phase.IDLE
    assert TRANSITIONS[(Phase.IDLE, TriggerKind.INVITED)] is Phase.INVITING
    # a failure during an invitation: it is given up first, then the failure is recovered
    assert (Phase.INVITING, TriggerKind.REPLACED) not in TRANSITIONS
    assert TRANSITIONS[(Phase.INVITING, TriggerKind.GROW_GIVEN_UP)] is Phase.IDLE
    # refused is final for the attempt; a second failure during a re-formation is not re-formed
    assert not [k for (p, k) in TRANSITIONS if p is Phase.REFUSED]
    assert (Phase.REPLACING, TriggerKind.REPLACED) not in TRANSITIONS
    assert all((p, TriggerKind.REFUSED) in TRANSITIONS for p in Phase if p is not Phase.REFUSED)


def test_the_counts_and_the_group_move_with_the_phases():
    s = _in(Phase.IDLE)
    s1 = step(s, Replaced(PENDING))
    assert isinstance(s1, InPlaceState) and (s1.generation, s1.used, s1.completed) == (3, 1, 0)
    s2 = step(s1, Reformed())
    assert isinstance(s2, InPlaceState) and (s2.phase, s2.completed, s2.pending) == (Phase.IDLE, 1, None)
    shrunk = step(_in(Phase.WAITING), _trigger(TriggerKind.SHRUNK))
    assert isinstance(shrunk, InPlaceState)
    assert (shrunk.active, shrunk.world_size, shrunk.num_nodes, shrunk.generation) == (("n0", "n2"), 4, 2, 3)
    done = step(shrunk, Reformed())
    assert (
        isinstance(done, InPlaceState) and done.completed == 1 and done.resized is None
    )  # a failure recovered
    grown = step(_in(Phase.GROWING), Reformed())
    assert isinstance(grown, InPlaceState) and grown.completed == 0  # a grow recovers no failure
    newcomer = step(_in(Phase.NEWCOMER_STARTING), Reformed())
    assert isinstance(newcomer, InPlaceState) and newcomer.completed == 0
    inv = step(s, Invited(INVITATION))
    assert isinstance(inv, InPlaceState) and inv.invited == 3 and inv.next_generation_base == 3
    gave = step(inv, GrowGivenUp((("n2", 1),)))
    assert isinstance(gave, InPlaceState) and gave.gave_up("n2") == 1 and gave.gave_up("n3") is None
    again = step(step(gave, Invited(INVITATION)), GrowGivenUp((("n2", 2),)))  # type: ignore[arg-type]
    assert isinstance(again, InPlaceState) and again.given_up == (("n2", 2),)
    joined = step(s, Joined(3))
    assert isinstance(joined, InPlaceState) and (joined.generation, joined.active) == (3, s.active)


def test_telling_ready_keeps_the_start_and_is_said_once():
    s = step(_in(Phase.IDLE), NewcomerStarted(3, NOW))
    assert isinstance(s, InPlaceState) and s.since == NOW and not s.said_ready
    r = step(s, ReadyTold())
    assert (
        isinstance(r, InPlaceState) and r.said_ready and r.since == NOW and r.phase is Phase.NEWCOMER_STARTING
    )


def test_the_rendered_table_lists_every_move_and_the_docs_show_it():
    table = render_table()
    rows = [line for line in table.splitlines()[2:] if line.startswith("| ")]
    assert len(rows) == len(TRANSITIONS)
    assert "| shrinking | reformed | idle |" in rows
    mermaid = render_mermaid()
    assert mermaid.startswith("stateDiagram-v2") and "inviting --> growing: grown" in mermaid
    doc = (Path(__file__).resolve().parents[2] / "docs" / "fast-recovery.md").read_text()
    assert "## The in-place machine" in doc
    assert table in doc and mermaid in doc  # the docs show the table as the code has it
    layout = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    assert mermaid in layout  # and the architecture page draws the same machine


# --- the membership function --------------------------------------------------------------------------

POW2 = SizeRule("power_of_two")


def _member(**kw) -> MembershipView:
    base: dict = dict(node="n0", active=("n0", "n1", "n2", "n3"), nproc_per_node=2, min_nodes=1, max_nodes=4)
    return MembershipView(Role.MEMBER, **{**base, **kw})


def test_a_lost_node_shrinks_the_group_to_the_survivors_on_the_first_survivor_only():
    got = next_group(_member(lost=("n3",)))
    assert (got.change, got.members, got.world_size, got.generation, got.lost) == (
        Change.SHRINK,
        ("n0", "n1", "n2"),
        6,
        1,
        ("n3",),
    )
    assert next_group(_member(node="n1", lost=("n3",))).change is Change.KEEP  # n0 decides
    assert next_group(_member(node="n1", lost=("n0",))).change is Change.SHRINK  # n1 is first now
    assert next_group(_member(lost=("n3",), spares=("s",))).change is Change.KEEP  # a spare takes it
    refused = next_group(_member(lost=("n3",), rule=POW2))
    assert refused.change is Change.RESTART and "= 6 processes is not" in refused.reason


def test_a_shrink_to_one_node_says_so_in_the_singular():
    one = next_group(_member(active=("n0", "n1"), nproc_per_node=1, lost=("n1",)))
    assert one.change is Change.SHRINK
    assert "the surviving node re-forms in place" in one.reason and "to 1 process;" in one.reason
    many = next_group(_member(lost=("n3",)))
    assert "the 3 surviving nodes re-form in place" in many.reason and "to 6 processes;" in many.reason


def test_offers_grow_the_group_to_the_largest_valid_size_within_max():
    view = _member(active=("n0", "n1"), offers=("n2", "n3", "n4"), rule=POW2)
    got = next_group(view)
    assert (got.change, got.members, got.joining, got.world_size) == (
        Change.GROW,
        ("n0", "n1", "n2", "n3"),
        ("n2", "n3"),
        8,
    )
    assert next_group(dataclasses.replace(view, busy=True)).change is Change.KEEP


def test_a_spare_takes_a_lost_place_only_while_another_nodes_ranks_wait():
    silent = {"n0": 0.1, "n1": 9.0}
    lost = lost_nodes(("n0", "n1"), silent, 2.5, frozenset({"n0"}))
    assert lost == ("n1",)
    view = MembershipView(
        Role.SPARE, "s", ("n0", "n1"), lost=lost, silent=silent, spares=("s",), waiting=frozenset({"n0"})
    )
    got = next_group(view)
    assert (got.change, got.members, got.lost) == (Change.TAKE_OVER, ("n0", "s"), ("n1",))
    assert next_group(dataclasses.replace(view, waiting=frozenset())).change is Change.KEEP


def test_an_arriving_node_offers_only_to_a_group_with_room():
    view = MembershipView(Role.ARRIVING, "n2", ("n0", "n1"), max_nodes=3, world_size=4)
    got = next_group(view)
    assert (got.change, got.members, got.joining) == (Change.OFFER, ("n0", "n1", "n2"), ("n2",))
    full = next_group(dataclasses.replace(view, max_nodes=2))
    assert full.change is Change.RESTART and "joining the rendezvous" in full.reason
