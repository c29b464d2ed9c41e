"""Ledger events in, incidents out: the call the agent makes after a failure."""

from __future__ import annotations

import dataclasses

import pytest

from stalwart.diagnose.incident import Component
from stalwart.diagnose.pipeline import incidents_from_events, interruptions
from stalwart.diagnose.signals import from_ps_states
from stalwart.events import AttemptStarted, DecisionTaken, FailureDetected, StackCaptured
from stalwart.events.node_health import HealthChecked


def timeout(ts, node, rank):
    return FailureDetected(
        ts=ts + 2,
        node=node,
        rank=rank,
        failure="crash",
        onset=ts,
        exit_code=1,
        error_type="torch.distributed.DistBackendError",
        evidence="exit 1",
        error_message="Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)",
    )


def test_two_interruptions_each_get_their_own_cause():
    xid = {
        "check": "kernel_log",
        "code": "gpu.xid",
        "subject": "gpu3",
        "severity": "fail",
        "message": "Xid 79 in kernel log (1x): GPU has fallen off the bus",
        "evidence": {"xid": 79},
    }
    evs = [
        AttemptStarted(ts=0, world_size=16, num_nodes=2, node="n1"),
        HealthChecked(
            ts=990,
            node="n2",
            level="passive",
            status="fail",
            action="drain_power_cycle",
            reason="xid 79",
            findings=(xid,),
        ),
        timeout(1000, "n1", 0),
        timeout(1001, "n2", 9),
        DecisionTaken(ts=1010, action="restart", reason="r"),
        timeout(5000, "n1", 1),
        DecisionTaken(ts=5010, action="restart", reason="r"),
        FailureDetected(
            ts=6000,
            node="n1",
            rank=0,
            failure="crash",
            onset=6000,
            error_type="ValueError",
            error_message="bad shape",
            evidence="exit 1",
        ),
    ]
    assert [len(g) for g in interruptions(evs)] == [2, 1, 1]
    incs = incidents_from_events(evs, now=7000)
    assert len(incs) == 2  # the ValueError is its own cause, not a communication symptom
    first, second = incs
    assert first.rule == "cross_layer:gpu-fell-off-bus" and first.blast_radius.nodes == ("n2",)
    assert first.blast_radius.ranks == (9,) and first.cost_gpu_s == pytest.approx(
        16 * (7000 - 1000)
    )  # from the first symptom
    assert second.rule == "cross_layer:no-cause"


def test_rank_in_d_state_is_a_hung_mount_not_an_nccl_error():
    ps = "  4242 D    nfs_wait_bit_killable\n  4243 Sl   futex_wait_queue\n  999 D    -\n"
    states = from_ps_states(ps, "n1", 995.0, {4242: 0, 4243: 1})
    assert [s.rank for s in states] == [0] and "nfs_wait_bit_killable" in states[0].text
    incs = incidents_from_events([timeout(1000, "n2", 5)], now=1100, extra=states)
    assert incs[0].component is Component.MOUNT and incs[0].blast_radius.nodes == ("n1",)


def _hang(ts: float, rank: int, injected: str = "") -> FailureDetected:
    return FailureDetected(
        ts=ts + 10, node="n1", rank=rank, failure="hang", onset=ts, evidence="silent 10s", injected=injected
    )


def test_a_stopped_ranks_hang_says_it_was_stopped():
    stopped = "(stopped, state T: read from outside by py-spy dump --nonblocking)\nThread 1 ..."
    evs = [
        AttemptStarted(ts=0, world_size=2, num_nodes=1, node="n1"),
        _hang(100, 1),
        StackCaptured(ts=111, node="n1", rank=1, stack=stopped, reason="hung rank"),
        StackCaptured(
            ts=111, node="n1", rank=0, stack="Thread 1 (most recent call first): ...", reason="peer"
        ),
    ]
    (inc,) = incidents_from_events(evs, now=120)
    assert inc.rule == "cross_layer:rank-stopped" and inc.confidence == 0.95
    assert inc.cause.startswith("rank 1 on n1 was stopped (state T")
    # the same hang with a stack the rank dumped itself is no stopped rank
    plain = [
        e if not isinstance(e, StackCaptured) else dataclasses.replace(e, stack="Thread 1 ...") for e in evs
    ]
    (inc,) = incidents_from_events(plain, now=120)
    assert inc.rule == "cross_layer:no-cause"


def test_a_stopped_peer_is_not_the_cause_of_another_ranks_hang():
    stopped = "(stopped, state T: read from outside by py-spy dump --nonblocking)\n"
    evs = [_hang(100, 0), StackCaptured(ts=111, node="n1", rank=1, stack=stopped, reason="peer")]
    (inc,) = incidents_from_events(evs, now=120)
    assert inc.rule == "cross_layer:no-cause"


def test_an_injected_hang_is_labelled_with_its_plan_entry():
    evs = [_hang(100, 1, injected="hang@rank=1,step=5")]
    (inc,) = incidents_from_events(evs, now=120)
    assert inc.rule == "cross_layer:chaos-injected" and inc.confidence == 1.0
    assert (
        inc.cause
        == "rank 1 hang: injected by the chaos plan (hang@rank=1,step=5): an injected fault, not a real one"
    )
