"""How the agent stops a hung group (launch/attempt/hang_monitor.py ``stop_hung``): the rank the
evidence pins the hang on first when its peers leave their live state, every rank at once otherwise."""

from __future__ import annotations

import signal

from stalwart.launch.attempt.hang_monitor import stop_hung
from stalwart.launch.fakes import FakeGroup


def test_a_local_hung_rank_is_killed_before_its_peers_get_their_grace():
    group = FakeGroup.of(range(4))
    stop_hung(group, 2, 3.0)
    assert (group.signals, group.stops) == ([signal.SIGKILL], [3.0])


def test_without_left_state_evidence_or_a_local_hung_rank_every_rank_stops_at_once():
    group = FakeGroup.of(range(4))
    stop_hung(group, 2, 0.0)  # no peer leaves its state
    assert (group.signals, group.stops) == ([], [0.0])
    unpinned = FakeGroup.of(range(4))
    stop_hung(unpinned, None, 3.0)  # nothing pins the hang on a rank: killing a guess first may not help
    assert (unpinned.signals, unpinned.stops) == ([], [0.0])
    remote = FakeGroup.of(range(4))
    stop_hung(remote, 6, 3.0)  # the hung rank is another node's: nothing here ends its collective
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
    from stalwart.policy.inplace import HangCulprits, HangEvidence

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
