"""The silent-data-corruption policy: localisation by majority and the response, over plain integers."""

from __future__ import annotations

import pytest

from stalwart.policy.sdc import (
    MAX_INTERVAL,
    ODD_ONE_OUT_CONFIDENCE,
    ReplicaVerdict,
    SdcAction,
    SdcNodeAction,
    SdcNodeExit,
    check_interval,
    decide,
    exit_after_quarantine,
    localise,
    quarantine,
)
from stalwart.policy.world_size import SizeRule, WorldPlan

CLEAN = [11, 22, 33]


def test_identical_replicas_agree_and_training_continues():
    found = localise([CLEAN, CLEAN, CLEAN])
    assert found.verdict is ReplicaVerdict.AGREE and found.clean and found.suspects == ()
    d = decide(found, step=40, clean_steps=[30], rollbacks=0)
    assert d.action is SdcAction.CONTINUE and d.to_step == -1


def test_the_odd_one_out_is_named_with_the_tensor_that_differs():
    found = localise([CLEAN, [11, 22 + 2**30, 33], CLEAN])
    assert found.verdict is ReplicaVerdict.ODD_ONE_OUT
    assert found.suspects == (1,)
    assert found.tensors == (1,)
    assert found.confidence == ODD_ONE_OUT_CONFIDENCE
    assert "rank 1" in found.reason and "2 of 3" in found.reason


def test_several_differing_from_a_majority_are_named_less_surely():
    bad = [11, 22, 34]
    found = localise([CLEAN, bad, CLEAN, [0, 22, 33], CLEAN])
    assert found.suspects == (1, 3)
    assert found.tensors == (0, 2)
    assert 0 < found.confidence < ODD_ONE_OUT_CONFIDENCE


def test_a_pair_that_disagrees_names_no_replica():
    found = localise([CLEAN, [11, 23, 33]])
    assert found.verdict is ReplicaVerdict.PAIR and found.suspects == () and not found.clean
    assert "2 replicas disagree" in found.reason


def test_no_majority_names_no_replica():
    found = localise([CLEAN, [1, 22, 33], CLEAN, [2, 22, 33]])
    assert found.verdict is ReplicaVerdict.SPLIT and found.suspects == () and found.confidence == 0.0


def test_rollback_goes_to_the_newest_clean_checkpoint_not_after_the_check():
    found = localise([CLEAN, [11, 22, 0], CLEAN])
    d = decide(found, step=35, clean_steps=[10, 20, 30, 40], rollbacks=0)
    assert d.action is SdcAction.ROLLBACK and d.to_step == 30 and d.suspects == (1,)
    assert "step 30" in d.reason and "after step 35" in d.reason


def test_a_pair_rolls_back_too():
    d = decide(localise([CLEAN, [0, 0, 0]]), step=12, clean_steps=[10], rollbacks=0)
    assert d.action is SdcAction.ROLLBACK and d.to_step == 10 and d.suspects == ()


def test_nothing_verified_clean_halts_with_a_reason():
    d = decide(localise([CLEAN, [0, 22, 33], CLEAN]), step=5, clean_steps=[], rollbacks=0)
    assert d.action is SdcAction.HALT and "nothing safe to roll back to" in d.reason


def test_corruption_that_keeps_coming_back_halts():
    found = localise([CLEAN, [0, 22, 33], CLEAN])
    d = decide(found, step=50, clean_steps=[40], rollbacks=3, max_rollbacks=3)
    assert d.action is SdcAction.HALT and d.suspects == (1,) and "3 rollback(s)" in d.reason
    assert decide(found, step=50, clean_steps=[40], rollbacks=2, max_rollbacks=3).action is SdcAction.ROLLBACK


def test_interval_keeps_the_check_within_its_budget():
    # a 0.2 ms check at 16 ms steps within 1%: every 2 steps (0.2 / (0.01 * 16) = 1.25, rounded up)
    assert check_interval(0.0002, 0.016, 0.01) == 2
    assert check_interval(0.002, 0.016, 0.01) == 13
    assert check_interval(0.0, 0.016, 0.01) == 1
    assert check_interval(10.0, 0.001, 0.01) == MAX_INTERVAL
    assert check_interval(0.001, 0.0, 0.01) == MAX_INTERVAL  # no step measured yet
    assert check_interval(0.001, 0.016, 0.0) == MAX_INTERVAL  # no budget


# --- quarantine: which node leaves the pool -----------------------------------------------------


def _quarantine_of(prints, nodes, step=41):
    found = localise(prints)
    names = [f"layer{i}.weight" for i in found.tensors]
    return quarantine(
        found.verdict,
        found.suspects,
        tuple(nodes[r] for r in found.suspects),
        found.confidence,
        step=step,
        tensors=names,
    )


def test_the_odd_one_out_quarantines_its_node_with_step_tensors_and_verdict_in_the_reason():
    q = _quarantine_of([CLEAN, [11, 22 + 2**30, 33], CLEAN], ["a", "b", "c"])
    assert q.action is SdcNodeAction.QUARANTINE and q.node == "b"
    assert "after step 41" in q.reason and "rank 1 on b" in q.reason
    assert "odd_one_out" in q.reason and "layer1.weight" in q.reason and "0.90" in q.reason


def test_the_odd_one_out_on_a_node_it_shares_with_the_majority_still_names_that_node():
    # one node, three GPUs: the faulty GPU is on it, and a node is what a scheduler drains
    q = _quarantine_of([CLEAN, [11, 22, 34], CLEAN], ["n", "n", "n"])
    assert q.action is SdcNodeAction.QUARANTINE and q.node == "n"


@pytest.mark.parametrize(
    "prints,nodes",
    [
        ([CLEAN, [11, 22, 34]], ["a", "b"]),  # pair: either may be the corrupted one
        ([CLEAN, [11, 22, 34], [12, 22, 33]], ["a", "b", "c"]),  # split: no majority
        ([CLEAN, CLEAN, CLEAN], ["a", "b", "c"]),  # agree
    ],
    ids=["pair", "split", "agree"],
)
def test_no_replica_named_quarantines_no_one(prints, nodes):
    q = _quarantine_of(prints, nodes)
    assert q.action is SdcNodeAction.KEEP and q.node == ""
    assert q.reason


def test_a_pair_or_split_quarantines_no_one_even_if_a_node_is_passed_along():
    for verdict in (ReplicaVerdict.PAIR, ReplicaVerdict.SPLIT):
        q = quarantine(verdict, (1,), ("b",), 0.99, step=7)
        assert q.action is SdcNodeAction.KEEP and q.node == "" and "not known" in q.reason


def test_several_odd_replicas_point_to_a_shared_cause_and_quarantine_no_one():
    q = _quarantine_of([CLEAN, [1, 2, 3], [1, 2, 3], CLEAN, CLEAN], ["a", "b", "c", "d", "e"])
    assert q.action is SdcNodeAction.KEEP and "shared cause" in q.reason


def test_a_suspect_named_without_enough_confidence_or_without_a_node_stays():
    low = quarantine(ReplicaVerdict.ODD_ONE_OUT, (1,), ("b",), 0.6, step=7)
    assert low.action is SdcNodeAction.KEEP and "confidence 0.60" in low.reason
    nameless = quarantine(ReplicaVerdict.ODD_ONE_OUT, (1,), ("",), 0.9, step=7)
    assert nameless.action is SdcNodeAction.KEEP


def test_the_reason_stays_one_short_line_with_many_tensors():
    q = quarantine(
        ReplicaVerdict.ODD_ONE_OUT, (1,), ("b",), 0.9, step=7, tensors=[f"t{i}" for i in range(50)]
    )
    assert "t2" in q.reason and "t3" not in q.reason and q.reason.endswith("...")
    assert "\n" not in q.reason


def _world(active: tuple[str, ...], spares: tuple[str, ...] = ()) -> WorldPlan:
    return WorldPlan(active, spares, 1, "planned")


@pytest.mark.parametrize(
    "world,min_nodes,rule,action,left,said",
    [
        # three nodes, two may run: the job goes on at two without the corrupting node
        (_world(("n0", "n1", "n2")), 2, SizeRule("multiple"), SdcNodeExit.LEAVE, 2, "goes on at 2 node(s)"),
        # a hot spare takes its place
        (_world(("n0", "n1"), ("s0",)), 2, SizeRule(), SdcNodeExit.LEAVE, 2, "with hot spare s0"),
        # the job needs both nodes and has no spare: leaving would end it
        (_world(("n0", "n1")), 2, SizeRule(), SdcNodeExit.STAY, 0, "no valid world size is left"),
        # the job's only node
        (None, 1, SizeRule(), SdcNodeExit.STAY, 0, "0 other node(s)"),
        # three left, but only a power of two is valid: two of them run
        (_world(("n0", "n1", "n2", "n3")), 2, SizeRule(), SdcNodeExit.LEAVE, 2, "goes on at 2 node(s)"),
    ],
    ids=["shrink", "spare", "needs-both", "only-node", "power-of-two"],
)
def test_a_quarantined_node_leaves_only_when_the_job_goes_on_without_it(
    world, min_nodes, rule, action, left, said
):
    d = exit_after_quarantine("n1", "quarantined", world, min_nodes, 4, rule)
    assert d.action is action and d.nodes_left == left and said in d.reason, d


@pytest.mark.parametrize("state", ["suspect", "not recorded in the node state (OSError: disk full)"])
def test_a_node_the_lifecycle_did_not_quarantine_stays(state):
    d = exit_after_quarantine("n1", state, _world(("n0", "n1", "n2")), 1, 3, SizeRule("multiple"))
    assert d.action is SdcNodeExit.STAY and state in d.reason


def test_a_slurm_drain_is_a_quarantine_too():
    d = exit_after_quarantine(
        "n1", "quarantined (drain: slurm)", _world(("n0", "n1", "n2")), 1, 3, SizeRule("multiple")
    )
    assert d.action is SdcNodeExit.LEAVE


def test_a_node_whose_agent_serves_a_store_the_others_need_stays():
    """Its agent's exit would take the store with it and end the job for every node."""
    three = _world(("n0", "n1", "n2"))
    first = exit_after_quarantine("n0", "quarantined", three, 2, 3, SizeRule("multiple"))
    assert first.action is SdcNodeExit.STAY and "the round's store" in first.reason, first
    host = exit_after_quarantine(
        "n1", "quarantined", three, 2, 3, SizeRule("multiple"), hosts="the rendezvous store"
    )
    assert host.action is SdcNodeExit.STAY and "serves the rendezvous store" in host.reason, host
