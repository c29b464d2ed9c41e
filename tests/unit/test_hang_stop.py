"""How the agent stops a hung group (policy/hang_pin.py ``hang_stop``, applied by
launch/attempt/hang_monitor.py ``stop_hang``): the rank the evidence pins the hang on first when its
peers leave their live state, across nodes the node whose ranks stand outside any collective first
and a node whose ranks all wait in one holding its stop, every rank at once otherwise."""

from __future__ import annotations

import signal

from stalwart.launch.attempt.hang_monitor import stop_hang
from stalwart.launch.fakes import FakeGroup
from stalwart.policy.hang_pin import HangCulprits, HangEvidence, HangStop, HangStopKind, hang_stop

NONE = HangEvidence.NONE


def _pinned(ranks=(), evidence=NONE, answered=(), waiting=()):
    return HangCulprits(frozenset(ranks), evidence, frozenset(answered), frozenset(waiting))


def test_the_pinned_rank_is_killed_first_when_its_peers_leave_their_state():
    local = frozenset(range(4))
    got = hang_stop(
        _pinned({2}, HangEvidence.OUTSIDE, local, {0, 1, 3}), local, other_nodes=False, leaves_state=True
    )
    assert (got.kind, got.first) == (HangStopKind.HUNG_FIRST, {2})
    assert got.reason == "rank 2 stands outside the collective its peers wait in (their stacks)"
    for other_nodes in (False, True):  # no state to wait for: at once, whatever the evidence
        pinned = _pinned({2}, HangEvidence.OUTSIDE, local, {0, 1, 3})
        got = hang_stop(pinned, local, other_nodes=other_nodes, leaves_state=False)
        assert got.kind is HangStopKind.AT_ONCE and "leave no live state" in got.reason


def test_across_nodes_the_hung_ranks_node_kills_first_and_a_waiting_node_holds():
    # node n1 of a 2-node job, its one rank asleep outside any collective: its stacks alone tell
    # nothing (hang_culprits needs peers to compare), but the group spans other nodes
    one = frozenset({1})
    got = hang_stop(_pinned((), NONE, one, ()), one, other_nodes=True, leaves_state=True)
    assert (got.kind, got.first) == (HangStopKind.HUNG_FIRST, one)
    assert "outside any collective while the group spans other nodes" in got.reason
    # node n0: every rank waits in a collective, so the hung rank is elsewhere: hold
    zero = frozenset({0, 2})
    got = hang_stop(_pinned((), NONE, zero, zero), zero, other_nodes=True, leaves_state=True)
    assert (got.kind, got.first) == (HangStopKind.HOLD, frozenset())
    assert "the hung rank is on another node" in got.reason
    # alone on one node the same stacks name nothing: at once, as before
    for local, waiting in ((one, ()), (zero, zero)):
        got = hang_stop(_pinned((), NONE, local, waiting), local, other_nodes=False, leaves_state=True)
        assert got.kind is HangStopKind.AT_ONCE, got


def test_across_nodes_missing_or_mixed_stacks_stop_at_once():
    local = frozenset({0, 2})
    # a rank that did not answer: no hold on a guess, no kill on a guess
    got = hang_stop(_pinned((), NONE, {0}, {0}), local, other_nodes=True, leaves_state=True)
    assert got.kind is HangStopKind.AT_ONCE and got.reason == "nothing on this node names the hung rank"
    got = hang_stop(_pinned((), NONE, {0}, ()), local, other_nodes=True, leaves_state=True)
    assert got.kind is HangStopKind.AT_ONCE
    got = hang_stop(_pinned((), NONE, (), ()), frozenset(), other_nodes=True, leaves_state=True)
    assert got.kind is HangStopKind.AT_ONCE  # no rank here at all


def test_stop_hang_kills_the_named_ranks_first_and_the_rest_within_the_grace():
    group = FakeGroup.of(range(4))
    stop_hang(group, HangStop(HangStopKind.HUNG_FIRST, frozenset({2}), "r"), 3.0)
    assert (group.signals, group.stops) == ([signal.SIGKILL], [3.0])
    for kind in (HangStopKind.AT_ONCE, HangStopKind.HOLD):  # a hold that ran out stops at once
        group = FakeGroup.of(range(4))
        stop_hang(group, HangStop(kind, frozenset(), "r"), 3.0)
        assert (group.signals, group.stops) == ([], [0.0])
    remote = FakeGroup.of(range(4))  # named ranks none of which runs here: nothing ends the collective
    stop_hang(remote, HangStop(HangStopKind.HUNG_FIRST, frozenset({6}), "r"), 3.0)
    assert (remote.signals, remote.stops) == ([], [0.0])


def _hang_of(rank: int):
    from stalwart.launch.decision import AttemptOutcome, Decision, DecisionKind
    from stalwart.policy.job import AttemptStatus
    from stalwart.policy.restart_policy import Failure

    failure = Failure("hang", 0, 17, rank, f"rank {rank} silent 10.00s at step 17")
    outcome = AttemptOutcome(AttemptStatus.FAILED, failure, detected_at=5.0)
    return Decision(DecisionKind.HANG, rank=rank, reason=failure.evidence, outcome=outcome)


def test_a_hang_is_named_after_the_rank_the_evidence_pins_it_on_in_the_failure_a_restart_reads():
    from stalwart.launch.attempt.hang_monitor import pin_hang
    from stalwart.policy.hang_pin import HangCulprits, HangEvidence

    d = pin_hang(_hang_of(0), HangCulprits(frozenset({2}), HangEvidence.OUTSIDE))
    assert d.rank == 2 and d.reason.startswith("rank 2 stands outside the collective"), d.reason
    assert d.outcome is not None and d.outcome.failure is not None
    assert d.outcome.failure.rank == 2 and d.outcome.failure.evidence == d.reason
    assert d.outcome.failure.step == 17 and d.outcome.detected_at == 5.0  # the rest is kept
    # no evidence, or evidence that agrees with the monitor: the decision as it was
    for pinned in (
        HangCulprits(frozenset(), HangEvidence.NONE),
        HangCulprits(frozenset({0, 3}), HangEvidence.SILENT),
    ):
        assert pin_hang(_hang_of(0), pinned) == _hang_of(0)
