"""The recovery ladder's first rung (policy/inplace.py): in place, or why not."""

from __future__ import annotations

import dataclasses

import pytest

from stalwart.policy.inplace import (
    InPlace,
    InPlaceCase,
    Join,
    JoinCase,
    NotInPlace,
    Refuse,
    ShrinkCase,
    ShrinkInPlace,
    TakeOver,
    TakeOverCase,
    Wait,
    decide,
    join,
    shrink,
    take_over,
)
from stalwart.policy.vocabulary import FailureKind
from stalwart.policy.world_size import SizeRule

RANKS = frozenset({0, 1, 2, 3})
BASE = InPlaceCase(
    enabled=True,
    failure=FailureKind.CRASH,
    failed=frozenset({2}),
    ranks=RANKS,
    in_place_ranks=RANKS,
    num_nodes=1,
    used=0,
    allowed=3,
    generation=4,
)


def test_a_crashed_rank_of_a_ready_group_is_replaced_in_place_into_the_next_generation():
    got = decide(BASE)
    assert isinstance(got, InPlace)
    assert got.ranks == frozenset({2}) and got.generation == 5
    assert "rank 2" in got.reason and "3 surviving ranks" in got.reason


@pytest.mark.parametrize("kind", [FailureKind.CRASH, FailureKind.HANG, FailureKind.PEER_LOST])
def test_lost_or_stuck_ranks_are_recoverable(kind):
    assert isinstance(decide(dataclasses.replace(BASE, failure=kind)), InPlace)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"enabled": False}, "--no-in-place"),
        ({"stopping": True}, "stop was requested"),
        ({"reforming": True}, "during an in-place re-formation"),
        ({"failure": FailureKind.EXCEPTION}, "script's own failure"),
        ({"in_place_ranks": frozenset({0, 1, 2})}, "rank 3 does not run under Session.run"),
        ({"num_nodes": 2, "failure": FailureKind.PEER_LOST}, "the lost peer is on another node"),
        ({"num_nodes": 2, "failure": FailureKind.HANG}, "a hang across nodes"),
        ({"failed": RANKS}, "no rank survived"),
        ({"used": 3}, "--in-place-max 3"),
        ({"forced_failure": True}, "forced to fail"),
    ],
)
def test_each_reason_to_leave_the_rung_is_named(change, why):
    got = decide(dataclasses.replace(BASE, **change))
    assert isinstance(got, NotInPlace)
    assert why in got.reason


def test_the_first_reason_that_applies_wins():
    got = decide(dataclasses.replace(BASE, enabled=False, failure=FailureKind.EXCEPTION))
    assert isinstance(got, NotInPlace) and "--no-in-place" in got.reason


def test_a_hang_is_pinned_on_the_stopped_rank_not_on_the_first_silent_one():
    from stalwart.policy.hang_pin import HangEvidence as E
    from stalwart.policy.hang_pin import hang_culprits

    def pin(*args):
        got = hang_culprits(*args)
        return set(got.ranks), got.evidence

    states = {0: "S", 1: "T", 2: "S", 3: "S"}
    assert pin(states, frozenset({0, 2, 3})) == ({1}, E.STOPPED)
    assert pin(states, frozenset()) == ({1}, E.STOPPED)  # stopped is evidence on its own
    running = {0: "S", 1: "S", 2: "R", 3: "S"}
    assert pin(running, frozenset({0, 2, 3})) == ({1}, E.SILENT)  # the one that could not dump its stack
    assert pin(running, frozenset({0})) == (set(), E.NONE)  # too few answered: no evidence
    every = frozenset({0, 1, 2, 3})
    assert pin(running, every) == (set(), E.NONE)  # all answered, no stack told: all wait alike
    # every rank answered: the one outside the collective its peers wait in
    assert pin(running, every, frozenset({0, 1, 3})) == ({2}, E.OUTSIDE)
    assert pin(running, every, every) == (set(), E.NONE)  # all in a collective: none tells
    assert pin(running, every, frozenset()) == (set(), E.NONE)  # none in one: none tells
    # a stack read outranks a missing one (a waiting peer can be late to answer on a busy machine)
    assert pin(running, frozenset({0, 2, 3}), frozenset({0, 3})) == ({2}, E.OUTSIDE)
    assert pin(running, frozenset({0, 2, 3}), frozenset({0, 2, 3})) == ({1}, E.SILENT)
    # and the stacks need most ranks to have answered
    assert pin(running, frozenset({0, 3}), frozenset({0})) == (set(), E.NONE)
    for evidence in E:  # every kind of evidence says something
        assert evidence.says


def test_a_hang_without_a_culprit_goes_down_the_ladder():
    got = decide(dataclasses.replace(BASE, failure=FailureKind.HANG, failed=frozenset()))
    assert isinstance(got, NotInPlace) and "cannot be told" in got.reason


def test_each_rank_lacking_the_state_receives_it_from_a_holder_of_the_same_shards():
    from stalwart.train.live_state import plan_sources

    # DDP: one shard key; rank 2 was replaced, rank 0 finished the interrupted step, ranks 1 and 3 did not
    assert plan_sources([(18, -1, 7), (17, -1, 7), (-1, -1, 7), (17, -1, 7)]) == (17, {0: 1, 2: 1})
    # HSDP, 2 replica groups of 2 shards (keys 10, 11): rank 3 gets shard 11 from rank 1, not rank 0
    assert plan_sources([(5, -1, 10), (5, -1, 11), (5, -1, 10), (-1, -1, 11)]) == (5, {3: 1})
    # plain FSDP: the replaced rank's shard lives nowhere else, so every rank falls back to a checkpoint
    assert plan_sources([(5, -1, 10), (5, -1, 11), (-1, -1, 12), (5, -1, 13)]) is None
    assert plan_sources([(-1, -1, 1), (-1, -1, 1)]) is None  # no live state at all


def test_a_sharded_step_that_landed_for_some_shards_resumes_where_every_shard_is_held():
    from stalwart.train.live_state import plan_sources

    # HSDP 2 x 2 after a replica group left: shard 10 took step 9, shard 11 did not. Without a copy
    # from before the step no step holds both shards (what CI saw: a fall back to the checkpoint)
    assert plan_sources([(9, -1, 10), (8, -1, 11), (9, -1, 10), (8, -1, 11)]) is None
    # shard 11's commit failed and its update landed anyway, keeping the state of step 8: step 9 has both
    assert plan_sources([(9, -1, 10), (9, 8, 11), (9, -1, 10), (9, 8, 11)]) == (9, {})
    # nobody's commit completed: those whose commit failed give their copies of step 8, and the lowest
    # step every shard is held at wins, even where a later one is held by every rank but one
    assert plan_sources([(9, 8, 10), (8, -1, 11), (9, 8, 10), (9, 8, 11)]) == (8, {})
    # a replaced rank of shard 10 receives step 8 from the lowest rank holding it: a copy counts
    assert plan_sources([(9, 8, 10), (8, -1, 11), (-1, -1, 10), (9, 8, 11)]) == (8, {2: 0})
    # DDP: a rank that kept a copy from before the step is still a holder of the lower step
    assert plan_sources([(18, 17, 7), (18, -1, 7), (-1, -1, 7)]) == (17, {1: 0, 2: 0})


def test_a_rank_crashed_on_one_node_of_several_is_replaced_in_place_by_its_own_agent():
    got = decide(dataclasses.replace(BASE, num_nodes=4))
    assert isinstance(got, InPlace) and got.ranks == frozenset({2}) and got.generation == 5


JOIN = JoinCase(
    enabled=True,
    generation=2,
    announced=0,
    announced_by="",
    waiting_since=None,
    now=100.0,
    bound_s=5.0,
    busy=False,
    stopping=False,
)


def test_a_node_joins_the_generation_another_node_announced():
    got = join(dataclasses.replace(JOIN, announced=3, announced_by="n7", waiting_since=99.0))
    assert isinstance(got, Join) and got.generation == 3 and "node n7" in got.reason


def test_an_announcement_of_the_current_or_an_older_generation_is_not_joined_again():
    for gen in (1, 2):
        assert isinstance(join(dataclasses.replace(JOIN, announced=gen, announced_by="n1")), Wait)


def test_ranks_waiting_for_an_announcement_wait_within_the_bound_and_are_refused_after_it():
    assert isinstance(join(dataclasses.replace(JOIN, waiting_since=96.0)), Wait)
    got = join(dataclasses.replace(JOIN, waiting_since=95.0))
    assert isinstance(got, Refuse) and "within 5s" in got.reason and "restarts" in got.reason


def test_nothing_to_do_when_no_rank_waits_and_nothing_is_announced():
    assert isinstance(join(JOIN), Wait)


def test_a_node_busy_with_its_own_re_formation_neither_joins_nor_refuses():
    busy = dataclasses.replace(JOIN, busy=True, announced=3, announced_by="n1", waiting_since=0.0)
    assert isinstance(join(busy), Wait)


@pytest.mark.parametrize(
    ("change", "why"), [({"stopping": True}, "stop was requested"), ({"enabled": False}, "off")]
)
def test_a_stopping_or_disabled_node_refuses_an_announced_re_formation(change, why):
    got = join(dataclasses.replace(JOIN, announced=3, announced_by="n1", **change))
    assert isinstance(got, Refuse) and why in got.reason


def test_a_node_whose_every_rank_failed_is_replaced_in_place_when_other_nodes_survive():
    alone = dataclasses.replace(BASE, ranks=frozenset({2}), in_place_ranks=frozenset({2}), num_nodes=2)
    assert isinstance(decide(alone), NotInPlace)  # no world size known: this node is the group
    got = decide(dataclasses.replace(alone, world_size=8))
    assert isinstance(got, InPlace) and got.ranks == frozenset({2})


SPARE = TakeOverCase(
    enabled=True,
    spare="s1",
    spares=("s1", "s2"),
    active=("n0", "n1", "n2"),
    silent={"n0": 0.1, "n1": 3.0, "n2": 0.2},
    waiting=frozenset({"n0", "n2"}),
    bound_s=2.5,
)


def test_a_spare_takes_the_place_of_a_silent_node_whose_peers_wait():
    got = take_over(SPARE)
    assert isinstance(got, TakeOver) and got.lost == "n1" and got.group_rank == 1
    assert "node n1 is lost" in got.reason and "n0, n2 wait" in got.reason


@pytest.mark.parametrize(
    "change",
    [
        {"waiting": frozenset()},  # a slow agent whose peers still train is never replaced
        {"silent": {"n0": 0.1, "n1": 2.0, "n2": 0.2}},  # not silent long enough
        {"enabled": False},
        {"spare": "s2"},  # one lost node: the first spare in order takes it
    ],
)
def test_a_spare_waits_otherwise(change):
    assert isinstance(take_over(dataclasses.replace(SPARE, **change)), Wait)


def test_two_lost_nodes_go_to_two_spares_in_order():
    both = dataclasses.replace(SPARE, silent={"n0": 0.1, "n1": 3.0, "n2": 9.0}, waiting=frozenset({"n0"}))
    first, second = take_over(both), take_over(dataclasses.replace(both, spare="s2"))
    assert isinstance(first, TakeOver) and isinstance(second, TakeOver)
    assert (first.lost, second.lost) == ("n1", "n2")


def test_a_node_whose_own_ranks_wait_is_alive_even_when_its_beat_stalls():
    stalled = dataclasses.replace(SPARE, silent={"n0": 0.1, "n1": 3.0, "n2": 0.2}, waiting=frozenset({"n1"}))
    assert isinstance(take_over(stalled), Wait)


def test_a_refusal_from_another_node_ends_the_wait_even_before_a_rank_waits():
    got = join(dataclasses.replace(JOIN, refused_by="n3", refused_why="the script raised"))
    assert isinstance(got, Refuse) and "node n3 does not re-form in place (the script raised)" in got.reason


def test_a_silent_node_ends_the_wait_only_when_no_spare_can_take_its_place():
    waiting = dataclasses.replace(JOIN, waiting_since=99.0, lost=("n4",))
    got = join(waiting)
    assert isinstance(got, Refuse) and "node n4 is lost" in got.reason
    assert isinstance(join(dataclasses.replace(waiting, spares=True)), Wait)


SHRINK = ShrinkCase(
    enabled=True,
    stopping=False,
    node="n0",
    active=("n0", "n1", "n2"),
    lost=("n1",),
    spares=False,
    nproc_per_node=2,
    min_nodes=2,
    rule=SizeRule("multiple", 2),
    generation=4,
)


def test_a_lost_node_without_a_spare_shrinks_the_survivors_in_place_in_their_order():
    got = shrink(SHRINK)
    assert isinstance(got, ShrinkInPlace)
    assert (got.active, got.world_size, got.generation) == (("n0", "n2"), 4, 5)
    assert "node n1 is lost" in got.reason and "from 6 to 4 processes" in got.reason


def test_only_the_first_survivor_decides_a_shrink():
    assert isinstance(shrink(dataclasses.replace(SHRINK, node="n2")), Wait)
    first_lost = dataclasses.replace(SHRINK, node="n1", lost=("n0",))  # the next node decides
    got = shrink(first_lost)
    assert isinstance(got, ShrinkInPlace) and got.active == ("n1", "n2"), got


@pytest.mark.parametrize(
    "change",
    [
        {"lost": ()},  # nothing lost
        {"lost": ("n9",)},  # a node outside the group (already dropped) is not lost again
        {"spares": True},  # a hot spare takes the place instead
        {"lost": ("n0", "n1", "n2")},  # no survivor
    ],
)
def test_no_shrink_is_decided_otherwise(change):
    assert isinstance(shrink(dataclasses.replace(SHRINK, **change)), Wait)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"enabled": False}, "in-place recovery is off"),
        ({"stopping": True}, "a stop was requested"),
        ({"min_nodes": 3}, "fewer than the minimum of 3"),
        (
            {"active": ("n0", "n1", "n2", "n3"), "rule": SizeRule("power_of_two")},
            "6 processes is not a power of two",
        ),
    ],
)
def test_each_reason_not_to_shrink_in_place_is_named(change, why):
    got = shrink(dataclasses.replace(SHRINK, **change))
    assert isinstance(got, Refuse) and why in got.reason and "the group restarts" in got.reason, got


def test_a_node_joins_a_shrink_in_its_new_place():
    got = join(dataclasses.replace(JOIN, announced=5, announced_by="n0", shrunk_to=4))
    assert isinstance(got, Join) and got.generation == 5 and "shrank the group in place to 4" in got.reason


def test_a_dead_agent_is_lost_at_once_and_the_reason_says_how_it_is_known():
    """The kernel closed the agent's liveness connection: no heartbeat bound to wait out."""
    fresh = dataclasses.replace(SPARE, silent={"n0": 0.1, "n1": 0.3, "n2": 0.2})
    assert isinstance(take_over(fresh), Wait)  # silent 0.3 s: a slow agent, not yet lost
    got = take_over(dataclasses.replace(fresh, dead=frozenset({"n1"})))
    assert isinstance(got, TakeOver) and got.lost == "n1"
    assert "node n1 is lost (its agent's process is gone: its liveness connection closed;" in got.reason
    assert "no heartbeat" in take_over(SPARE).reason  # a silent node is still named by its silence
    # a dead node whose ranks wait is not lost: an agent alive enough to write that its ranks wait
    assert isinstance(take_over(dataclasses.replace(fresh, dead=frozenset({"n0"}))), Wait)


def test_a_shrink_names_a_dead_agent_and_a_silent_host_apart():
    dead = shrink(dataclasses.replace(SHRINK, dead=frozenset({"n1"})))
    silent = shrink(dataclasses.replace(SHRINK, silent={"n1": 2.6}))
    assert isinstance(dead, ShrinkInPlace) and isinstance(silent, ShrinkInPlace)
    assert "node n1 is lost (its agent's process is gone: its liveness connection closed)" in dead.reason
    assert "node n1 is lost (no heartbeat for 2.6s)" in silent.reason


def test_a_node_whose_agent_left_the_job_is_named_as_leaving_in_a_shrink_and_a_take_over():
    gone = frozenset({"n1"})
    shrunk = shrink(dataclasses.replace(SHRINK, dead=gone, left=gone))
    assert isinstance(shrunk, ShrinkInPlace)
    assert "node n1 is lost (its agent left the job on purpose: it excluded its own node)" in shrunk.reason
    fresh = dataclasses.replace(SPARE, silent={"n0": 0.1, "n1": 0.3, "n2": 0.2})
    took = take_over(dataclasses.replace(fresh, dead=gone, left=gone))
    assert isinstance(took, TakeOver) and took.lost == "n1" and "left the job on purpose" in took.reason
