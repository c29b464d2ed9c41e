"""World-size policy: largest valid size, hot spares, spares stepping in."""

from __future__ import annotations

import pytest

from stalwart.errors import ConfigError
from stalwart.policy.world_size import (
    SizeRule,
    SizeRuleKind,
    WorldPlan,
    needed_by_others,
    plan_world,
    replace_failed,
)

NODES = ["n1", "n2", "n3", "n4"]


def test_four_nodes_lose_one_continue_at_two_with_a_spare_then_spare_steps_in():
    plan = plan_world(NODES, nproc_per_node=2, min_nodes=1, max_nodes=4)
    assert plan.active == ("n1", "n2", "n3", "n4") and plan.world_size == 8 and plan.spares == ()
    plan = replace_failed(plan, ["n3"], min_nodes=1, max_nodes=4)
    assert plan.active == ("n1", "n2") and plan.spares == ("n4",) and plan.world_size == 4
    assert "lost n3" in plan.reason and "hot spare" in plan.reason
    plan = replace_failed(plan, ["n1"], min_nodes=1, max_nodes=4)
    # the spare takes n1's slot: n2 keeps its position (and its ranks)
    assert plan.active == ("n4", "n2") and plan.spares == () and plan.world_size == 4
    assert "n4 replaces n1" in plan.reason


def test_multiple_of_divisor():
    rule = SizeRule("multiple", divisor=6)  # e.g. TP=2 x PP=3 with 2 procs per node -> 3-node steps
    plan = plan_world([f"n{i}" for i in range(8)], nproc_per_node=2, min_nodes=3, max_nodes=8, rule=rule)
    assert len(plan.active) == 6 and plan.world_size == 12 and len(plan.spares) == 2
    assert "multiple of 6" in plan.reason


def test_max_nodes_caps_and_leftovers_are_spares():
    plan = plan_world(NODES + ["n5"], nproc_per_node=1, min_nodes=1, max_nodes=2)
    assert plan.active == ("n1", "n2") and plan.spares == ("n3", "n4", "n5")


def test_cannot_run_below_min_nodes():
    plan = plan_world(["n1"], nproc_per_node=1, min_nodes=2, max_nodes=4)
    assert not plan.runnable and plan.world_size == 0 and "cannot run" in plan.reason


def test_returned_node_becomes_a_spare():
    plan = plan_world(["n1", "n2"], 1, 1, 4)
    plan = replace_failed(plan, [], 1, 4, returned=["n3"])
    assert plan.active == ("n1", "n2") and plan.spares == ("n3",)


def test_nonpower_of_two_nproc():
    # 3 processes per node: 3*n is never a power of two except... never for n>=1 -> cannot run
    assert not plan_world(NODES, 3, 1, 4).runnable
    assert plan_world(NODES, 3, 1, 4, SizeRule("multiple", 3)).world_size == 12


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(nproc_per_node=0, min_nodes=1, max_nodes=2),
        dict(nproc_per_node=1, min_nodes=3, max_nodes=2),
        dict(nproc_per_node=1, min_nodes=0, max_nodes=2),
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ConfigError):
        plan_world(NODES, **kwargs)


def test_bad_rule():
    with pytest.raises(ConfigError):
        SizeRule("prime")
    with pytest.raises(ConfigError):
        SizeRule("multiple", 0)


def test_a_rule_kind_is_an_enum_given_by_its_name_or_member():
    assert (
        SizeRule("multiple", 3) == SizeRule(SizeRuleKind.MULTIPLE, 3) == SizeRule(kind="multiple", divisor=3)
    )
    assert SizeRule().kind is SizeRuleKind.POWER_OF_TWO and SizeRule().kind == "power_of_two"
    assert (
        SizeRule("multiple", 3).describe() == "a multiple of 3" and SizeRule().describe() == "a power of two"
    )
    assert [n for n in range(1, 13) if SizeRule("multiple", 3).valid(n)] == [3, 6, 9, 12]
    assert [n for n in range(1, 13) if SizeRule().valid(n)] == [1, 2, 4, 8]


def test_a_node_may_leave_unless_its_agent_serves_a_store_the_others_need():
    three = WorldPlan(("n0", "n1", "n2"), (), 1, "three nodes")
    assert needed_by_others("n1", three) == ""  # serves nothing: it may leave
    assert needed_by_others("n0", WorldPlan(("n0",), (), 1, "alone")) == ""  # no other node needs it
    assert needed_by_others("n0", None) == ""
    host = needed_by_others("n1", three, "the rendezvous store")
    assert host == (
        "n1's agent serves the rendezvous store, which the other nodes need: leaving would end the job "
        "for every node"
    )
    both = needed_by_others("n0", three, "the rendezvous store")
    assert "serves the rendezvous store and the round's store (as the group's first node)" in both
