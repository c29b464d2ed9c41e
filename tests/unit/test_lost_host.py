"""A peer loss is put on the host that left, with the survivor as a witness (not as the blast radius)."""

from __future__ import annotations

from stalwart.diagnose.incident import lost_host
from stalwart.launch.attempt.monitors import crash
from stalwart.launch.snapshot import RankView, Snapshot
from stalwart.policy.world_size import WorldPlan
from stalwart.protocol.error_record import ErrorRecord

T0 = 1_000_000.0
GLOO = "Connection closed by peer [10.77.0.2]:41002"


def test_the_transport_names_the_host_by_address_or_name():
    assert lost_host("h0", ("h0", "10.77.0.2", "10.77.0.3"), GLOO).node == "10.77.0.2"
    got = lost_host("a", ("a", "b", "c"), "RuntimeError: [c]:5000 connection reset")
    assert got is not None and (got.node, got.how) == ("c", "named by the transport")
    # a name that is only part of another word or address names nothing
    assert lost_host("a", ("a", "b", "c"), "abc 10.77.0.23 reset") is None


def test_with_one_other_host_membership_tells_and_with_several_unnamed_nothing_is_guessed():
    got = lost_host("h0", ("h0", "h1"), GLOO)
    assert got is not None and (got.node, got.how) == ("h1", "the only other host of the round")
    assert lost_host("h0", ("h0", "h1", "h2"), GLOO) is None
    assert lost_host("h0", ("h0",), GLOO) is None


def _snap(world: WorldPlan | None) -> Snapshot:
    err = ErrorRecord("DistBackendError", GLOO, 12, T0 + 1.0)
    return Snapshot(
        now=T0 + 2,
        tick=0.5,
        node="h0",
        started=T0,
        ranks=(RankView(0, T0), RankView(1, T0)),
        codes={0: 1, 1: None},
        errors={0: err},
        world=world,
    )


def test_the_survivors_incident_names_the_host_that_left_and_itself_as_witness():
    d = crash(_snap(WorldPlan(("h0", "h1"), (), 2, "")), {0: 1})
    assert d.outcome is not None and d.outcome.failure is not None
    assert d.outcome.failure.kind == "peer_lost"
    inc = d.incident
    assert inc is not None and inc.cause.startswith("host h1 left the job: rank 0 on h0 lost its peer")
    assert inc.blast_radius.nodes == ("h1",)
    assert (
        "witness h0: rank 0" in inc.evidence
        and "lost host h1: the only other host of the round" in inc.evidence
    )
    # without the round's membership the survivor says only what it saw
    alone = crash(_snap(None), {0: 1}).incident
    assert alone is not None and alone.blast_radius.nodes == ("h0",) and "left" not in alone.cause


def test_a_node_waiting_to_join_after_the_final_step_restarts_nothing():
    from stalwart.launch.attempt.monitors import membership

    base = dict(now=T0 + 2, tick=0.5, node="h0", started=T0, ranks=(), codes={}, nodes_waiting=1)
    assert membership(Snapshot(**base, total_steps=200, max_done_step=198)) is not None
    assert membership(Snapshot(**base, total_steps=200, max_done_step=199)) is None
    assert membership(Snapshot(**base, max_done_step=10_000)) is not None  # no announced end: re-form
