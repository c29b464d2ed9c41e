"""A group that shrank in place grows back in place when a node returns: the pure policies of
stalwart.policy.inplace (the first node's ``grow``, the arriving node's ``offer``, the other nodes'
``join``). Values in, a decision out: no store, no torch, no clock."""

from __future__ import annotations

import dataclasses

import pytest

from stalwart.policy.inplace import (
    GrowCase,
    GrowInPlace,
    Join,
    JoinCase,
    Offer,
    OfferCase,
    Refuse,
    Wait,
    grow,
    join,
    offer,
)
from stalwart.policy.world_size import SizeRule

ANY = SizeRule("multiple", 1)
POW2 = SizeRule("power_of_two")

# --- the first node's policy: grow --------------------------------------------------------------------

GROW = GrowCase(
    enabled=True,
    stopping=False,
    busy=False,
    node="n0",
    active=("n0", "n1"),
    offers=("n2",),
    nproc_per_node=2,
    max_nodes=4,
    rule=ANY,
    generation=3,
)


def test_grow_takes_the_offers_in_the_order_they_came_after_the_nodes_in_the_group():
    got = grow(dataclasses.replace(GROW, offers=("n3", "n2")))
    assert got == GrowInPlace(
        active=("n0", "n1", "n3", "n2"),
        joining=("n3", "n2"),
        world_size=8,
        generation=4,
        reason=(
            "node n3, n2 offered to return: the group grows back in place from 4 to 8 processes at the "
            "next step boundary; the 2 node(s) in it keep their processes and places, and a replica "
            "sends the newcomers the live state (generation 4)"
        ),
    )


def test_grow_takes_no_more_offers_than_the_maximum_node_count_allows():
    got = grow(dataclasses.replace(GROW, offers=("n2", "n3", "n4"), max_nodes=3))
    assert isinstance(got, GrowInPlace)
    assert (got.active, got.joining, got.world_size) == (("n0", "n1", "n2"), ("n2",), 6)


def test_grow_under_pow2_takes_the_largest_count_of_offers_that_gives_a_valid_size():
    case = dataclasses.replace(GROW, offers=("n2", "n3", "n4"), max_nodes=8, nproc_per_node=1, rule=POW2)
    got = grow(case)  # 5 nodes is no power of two; 4 is
    assert isinstance(got, GrowInPlace)
    assert (got.active, got.joining, got.world_size, got.generation) == (
        ("n0", "n1", "n2", "n3"),
        ("n2", "n3"),
        4,
        4,
    )
    assert "from 2 to 4 processes" in got.reason


def test_grow_counts_a_repeated_offer_once():
    got = grow(dataclasses.replace(GROW, offers=("n2", "n2", "n3")))
    assert isinstance(got, GrowInPlace) and got.joining == ("n2", "n3")


@pytest.mark.parametrize(
    "change",
    [
        {"offers": ("n2",), "nproc_per_node": 1, "rule": POW2},  # 3 processes: no valid size
        {"max_nodes": 2},  # already at the maximum
        {"busy": True},
        {"stopping": True},
        {"enabled": False},
        {"node": "n1"},  # only the group's first node decides
        {"offers": ("n1", "n0")},  # offers only from nodes already in the group
        {"offers": ()},
        {"active": ()},
    ],
)
def test_grow_waits(change):
    assert grow(dataclasses.replace(GROW, **change)) == Wait()


# --- the arriving node's policy: offer ----------------------------------------------------------------

OFFER = OfferCase(enabled=True, node="n2", active=("n0", "n1"), world_size=4, max_nodes=3)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"enabled": False}, "in-place recovery is off (--no-in-place): joining the rendezvous"),
        ({"active": ()}, "the running group has not shrunk in place: joining the rendezvous"),
        ({"node": "n1"}, "node n1 is already in the running group: joining the rendezvous"),
        ({"max_nodes": 2}, "the running group already has --nnodes MAX 2 nodes: joining the rendezvous"),
    ],
)
def test_an_arriving_node_does_not_offer(change, why):
    assert offer(dataclasses.replace(OFFER, **change)) == Refuse(why)


def test_an_arriving_node_offers_a_free_place_in_a_group_below_its_maximum():
    assert offer(OFFER) == Offer(
        "the running group has 2 of at most 3 nodes (4 processes): node n2 offers to take a free place "
        "in place"
    )


# --- the other nodes' policy: join a grow -------------------------------------------------------------

JOIN = JoinCase(
    enabled=True,
    generation=3,
    announced=4,
    announced_by="n0",
    waiting_since=None,
    now=10.0,
    bound_s=5.0,
    busy=False,
    stopping=False,
    grown_to=6,
)


def test_a_node_joins_a_grow_another_node_announced():
    assert join(JOIN) == Join(
        4,
        "node n0 grew the group back in place to 6 processes (a node returned); this node's ranks keep "
        "their processes and join generation 4 at the next step boundary",
    )


def test_a_grow_reads_as_a_grow_even_when_a_shrink_size_is_set_too():
    got = join(dataclasses.replace(JOIN, shrunk_to=2))
    assert isinstance(got, Join) and "grew the group back" in got.reason


def test_a_grow_is_refused_by_a_stopping_node_and_waited_out_by_a_busy_one():
    assert join(dataclasses.replace(JOIN, stopping=True)) == Refuse(
        "node n0 re-forms in place, but a stop was requested: the group restarts"
    )
    assert join(dataclasses.replace(JOIN, busy=True)) == Wait()
