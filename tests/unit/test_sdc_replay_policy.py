"""Localisation by replay (policy.sdc.replayed), over plain integers: every replica's fingerprints when
a mismatch that named no replica was found, and again when the replay completed the same step."""

from __future__ import annotations

import pytest

from stalwart.policy.sdc import (
    ODD_ONE_OUT_CONFIDENCE,
    QUARANTINE_CONFIDENCE,
    ReplayOutcome,
    ReplicaVerdict,
    SdcAction,
    SdcNodeAction,
    decide,
    localise,
    quarantine,
    replayed,
)

A = [11, 22, 33]  # the state the replay re-computes
B = [11, 22 + 2**30, 33]  # a flipped bit in tensor 1
C = [11, 22, 33 + 2**7]  # another wrong result, in tensor 2
D = [11, 22 - 2**4, 33]


def test_a_replay_that_matches_one_replicas_first_result_names_the_other():
    found = replayed([A, B], [A, A], step=31)
    assert found.outcome is ReplayOutcome.TRANSIENT
    assert found.suspects == (1,) and found.confidence == ODD_ONE_OUT_CONFIDENCE
    assert found.confidence >= QUARANTINE_CONFIDENCE, "named surely enough to quarantine its node"
    assert found.tensors == (1,)
    assert found.reason.startswith(
        "replay at step 31 matched rank 0's first result; rank 1's first result differed: rank 1 corrupted"
    )
    assert replayed([B, A], [A, A], step=31).suspects == (0,)  # whichever replica it was


def test_a_replay_that_agrees_with_neither_first_result_names_nobody():
    """The check came after the next all-reduce: the corrupted replica's gradients reached the other
    one too (or the job does not replay bit for bit)."""
    found = replayed([B, C], [A, A], step=33)
    assert found.outcome is ReplayOutcome.SPREAD and found.suspects == () and found.confidence == 0.0
    assert "did not repeat" in found.reason and "not known" in found.reason
    assert found.tensors == (1, 2)


def test_the_same_mismatch_bit_for_bit_is_deterministic_and_names_nobody():
    found = replayed([A, B], [A, B], step=31)
    assert found.outcome is ReplayOutcome.REPEATED and found.suspects == () and found.confidence == 0.0
    assert "deterministic" in found.reason and "not known" in found.reason


def test_a_replica_that_does_not_reproduce_itself_while_the_other_does_is_faulty():
    found = replayed([A, B], [A, C], step=31)
    assert found.outcome is ReplayOutcome.INTERMITTENT
    assert found.suspects == (1,) and found.confidence == ODD_ONE_OUT_CONFIDENCE
    assert "rank 0 reproduced its first result, rank 1 did not: rank 1 faulty" in found.reason
    assert found.tensors == (1, 2)


@pytest.mark.parametrize("again", [[C, D], [B, A]], ids=["both-new", "swapped"])
def test_disagreeing_again_with_no_replica_that_reproduced_itself_names_nobody(again):
    found = replayed([A, B], again, step=31)
    assert found.outcome is ReplayOutcome.UNSTABLE and found.suspects == () and found.confidence == 0.0
    assert "no replica reproduced its first result" in found.reason


def test_a_replay_that_never_reached_the_step_says_so_and_names_nobody():
    found = replayed([A, B], None, step=31, reached=25)
    assert found.outcome is ReplayOutcome.NOT_REACHED and found.suspects == ()
    assert found.confidence == 0.0 and found.tensors == (1,)
    assert "stopped after step 25, before step 31" in found.reason


def test_with_more_replicas_several_corrupted_ones_are_named_less_surely():
    # a split of four (two against two): the replay reproduced ranks 0 and 2
    found = replayed([A, B, A, B], [A, A, A, A], step=40)
    assert found.outcome is ReplayOutcome.TRANSIENT and found.suspects == (1, 3)
    assert found.confidence < ODD_ONE_OUT_CONFIDENCE
    # replicas that reproduced themselves but hold different states give no reference
    mixed = replayed([A, B, C], [A, B, D], step=40)
    assert mixed.outcome is ReplayOutcome.UNSTABLE and mixed.suspects == ()
    assert "ranks 0, 1 reproduced theirs, which differ" in mixed.reason


def test_a_replay_that_names_one_replica_quarantines_its_node():
    q = quarantine(
        ReplicaVerdict.REPLAYED, (1,), ("n1",), ODD_ONE_OUT_CONFIDENCE, step=31, tensors=["model.0.weight"]
    )
    assert q.action is SdcNodeAction.QUARANTINE and q.node == "n1"
    assert "after step 31" in q.reason and "rank 1 on n1 was named by replaying the step" in q.reason
    assert "replayed" in q.reason and "model.0.weight" in q.reason


def test_a_replay_that_names_nobody_or_several_quarantines_nobody():
    none = quarantine(ReplicaVerdict.REPLAYED, (), (), 0.0, step=31)
    assert none.action is SdcNodeAction.KEEP and "names no replica" in none.reason
    several = quarantine(ReplicaVerdict.REPLAYED, (1, 3), ("b", "d"), 0.6, step=40)
    assert several.action is SdcNodeAction.KEEP and "shared cause" in several.reason


def test_a_replayed_finding_handed_to_decide_still_rolls_back():
    """localise never gives it; were it passed, the safe response to a finding is a rollback."""
    found = localise([A, B])
    as_replayed = type(found)(ReplicaVerdict.REPLAYED, (1,), 0.9, (1,), "replayed")
    d = decide(as_replayed, step=31, clean_steps=[30], rollbacks=0)
    assert d.action is SdcAction.ROLLBACK and d.to_step == 30
