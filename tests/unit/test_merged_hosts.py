"""One account across hosts: two agents' ledgers of a partition, merged (hand-built events).

h0 and h1 train at world size 2 (global rank 0 on h0). h1 is cut off at t=20: h0 notices at 30,
re-forms alone and trains steps 20-39 from t=35 to t=55; h1 notices only at 54 (after the heal),
then both re-form at world size 2 and train steps 40-44 from t=60 to t=65; the job ends at 66.
"""

from __future__ import annotations

from stalwart.account.goodput import BUCKETS, compute
from stalwart.account.hosts import host_views
from stalwart.account.report import build
from stalwart.events import (
    AttemptStarted,
    CheckpointCommitted,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from stalwart.ledger import LedgerWriter

RUN = "mh"


def _steps(node: str, attempt: int, rank: int, first: int, t: float, n: int) -> list[StepCompleted]:
    return [
        StepCompleted(
            ts=t + i + 1.0,
            run_id=RUN,
            node=node,
            attempt=attempt,
            rank=rank,
            step=first + i,
            start=t + i,
            duration=1.0,
        )
        for i in range(n)
    ]


def _ctx(node: str, attempt: int) -> dict:
    return {"run_id": RUN, "node": node, "attempt": attempt}


def partition_run() -> tuple[list, list]:
    h0 = [
        JobStarted(ts=0.0, script="t.py", **_ctx("h0", 0)),
        AttemptStarted(ts=1.0, world_size=2, num_nodes=2, group_rank=0, **_ctx("h0", 0)),
        *_steps("h0", 0, 0, 0, 2.0, 18),  # steps 0-17, t=2..20
        CheckpointCommitted(ts=15.0, rank=0, step=13, path="c13", stall_s=0.0, **_ctx("h0", 0)),
        FailureDetected(
            ts=30.0, failure="peer_lost", evidence="h1 left", onset=20.0, step=18, rank=0, **_ctx("h0", 0)
        ),
        DecisionTaken(ts=30.5, action="restart", reason="peer lost", **_ctx("h0", 0)),
        AttemptStarted(ts=31.0, world_size=1, num_nodes=1, group_rank=0, **_ctx("h0", 1)),
        TrainingResumed(ts=34.0, step=13, from_checkpoint="c13", **_ctx("h0", 1)),
        *_steps("h0", 1, 0, 13, 35.0, 20),  # steps 13-32, t=35..55
        DecisionTaken(ts=56.0, action="restart", reason="a node waits to join", **_ctx("h0", 1)),
        AttemptStarted(ts=57.0, world_size=2, num_nodes=2, group_rank=0, **_ctx("h0", 2)),
        *_steps("h0", 2, 0, 33, 60.0, 5),  # steps 33-37, t=60..65
        JobEnded(
            ts=66.0, verdict="done", outcome="succeeded", exit_code=0, requeue_helps=False, **_ctx("h0", 2)
        ),
    ]
    h1 = [
        JobStarted(ts=0.5, script="t.py", **_ctx("h1", 0)),
        AttemptStarted(ts=1.0, world_size=2, num_nodes=2, group_rank=1, **_ctx("h1", 0)),
        *_steps("h1", 0, 1, 0, 2.0, 18),
        FailureDetected(
            ts=54.0, failure="hang", evidence="no progress", onset=20.0, step=18, rank=1, **_ctx("h1", 0)
        ),
        DecisionTaken(ts=54.5, action="restart", reason="hang", **_ctx("h1", 0)),
        AttemptStarted(ts=57.0, world_size=2, num_nodes=2, group_rank=1, **_ctx("h1", 2)),
        *_steps("h1", 2, 1, 33, 60.0, 5),
        JobEnded(
            ts=66.0, verdict="done", outcome="succeeded", exit_code=0, requeue_helps=False, **_ctx("h1", 2)
        ),
    ]
    return h0, h1


def _booked(gp, a: float, b: float) -> dict[str, float]:
    out = dict.fromkeys(BUCKETS, 0.0)
    for lo, hi, label in gp.timeline:
        out[label] += max(0.0, min(hi, b) - max(lo, a))
    return out


def test_a_late_detection_never_books_the_survivors_training_as_detection():
    h0, h1 = partition_run()
    gp = compute(sorted(h0 + h1, key=lambda e: e.ts))
    assert abs(sum(gp.buckets.values()) - gp.wall_s) < 1e-9
    assert abs(sum(b - a for a, b, _ in gp.timeline) - gp.wall_s) < 1e-9
    # the survivor's 20 steps alone (t=35..55) are productive, whatever h1 noticed at t=54
    assert _booked(gp, 35.0, 55.0)["productive"] == 20.0
    # detection is the job's: from the cut to the first host noticing it, not h1's 34 s
    assert gp.buckets["detection"] == 10.0
    assert gp.buckets["productive"] == 18.0 - 5.0 + 20.0 + 5.0  # less lost work since step 13's save
    assert gp.steps_completed == 38
    # one fault, seen from both sides: one interruption, detected when the first host noticed, put
    # on the cut-off host (its hang is the root cause; the survivor saw a peer lost)
    assert [(c.node, c.detection_s, c.failure) for c in gp.interruptions] == [("h1", 10.0, "hang")]


def test_two_hosts_failing_apart_are_two_interruptions():
    h0, h1 = partition_run()
    later = [
        e
        if not (isinstance(e, FailureDetected) and e.node == "h1")
        else FailureDetected(
            ts=54.0, failure="crash", evidence="gone", onset=45.0, step=40, rank=1, **_ctx("h1", 0)
        )
        for e in h1
    ]  # h1's own crash long after h0 noticed the first fault: a fault of its own
    gp = compute(sorted(h0 + later, key=lambda e: e.ts))
    assert [(c.node, c.failure) for c in gp.interruptions] == [("h0", "peer_lost"), ("h1", "crash")]
    # h1's crash came while h0 trained alone without it: it costs the job's timeline nothing
    assert _booked(gp, 35.0, 55.0)["productive"] == 20.0


def test_one_ledger_alone_keeps_its_own_detection():
    h0, h1 = partition_run()
    only_h1 = [e for e in h1 if not isinstance(e, StepCompleted) or e.attempt == 0]
    gp = compute(only_h1)  # nobody else trained: the whole wait is detection
    assert _booked(gp, 20.0, 54.0)["detection"] == 34.0


def test_each_host_line_says_what_that_host_saw():
    h0, h1 = partition_run()
    v0, v1 = host_views(h0 + h1)
    assert (v0.node, v1.node) == ("h0", "h1")
    alone = next(a for a in v0.attempts if a.attempt == 1)
    assert (alone.num_nodes, alone.world_size, alone.steps, alone.first_step, alone.last_step) == (
        1,
        1,
        20,
        13,
        32,
    )
    assert alone.trained_s == 20.0
    assert [(d.failure, d.detection_s) for d in v0.detections] == [("peer_lost", 10.0)]
    assert [(d.failure, d.detection_s) for d in v1.detections] == [("hang", 34.0)]
    assert v1.steps == 18 + 5 and 1 not in {a.attempt for a in v1.attempts}
    assert "attempt 1 (1 host, world 1): 20 steps 13-32 in 20.00s" in v0.line()
    assert "hang after 34.00s" in v1.line()


def test_the_report_of_a_run_dir_with_two_agents_ledgers_merges_them(tmp_path):
    h0, h1 = partition_run()
    for node, evs in (("h0", h0), ("h1", h1)):
        w = LedgerWriter(tmp_path / "ledger" / f"agent-{node}-1.ledger", writer=f"agent {node}")
        for e in evs:
            w.append(e)
        w.close()
    rep = build(tmp_path)
    assert [h["node"] for h in rep["hosts"]] == ["h0", "h1"]
    assert rep["buckets_s"]["detection"] == 10.0 and rep["steps_completed"] == 38
    assert rep["hosts"][0]["steps"] == 20 + 18 + 5
    assert rep["reliability"]["failures"] == 1 and rep["reliability"]["mttr_s"]["detect_s"] == 10.0


def test_one_fault_seen_from_both_hosts_is_one_row_of_the_recovery_table():
    from stalwart.account.recovery import recoveries

    h0, h1 = partition_run()
    rows = recoveries(sorted(h0 + h1, key=lambda e: e.ts))
    # h1's hang (the root cause) and h0's lost peer are one interruption: one row, told from the root
    assert [(r.failure, r.rank) for r in rows] == [("hang", 1)]
    h0_alone = recoveries(sorted(h0, key=lambda e: e.ts))
    assert [(r.failure, r.rank) for r in h0_alone] == [("peer_lost", 0)]


def test_a_lost_peer_reported_after_the_other_hosts_decision_is_the_same_fault_until_workers_start():
    """A whole-group restart across nodes: h1 declares its rank hung and decides the restart; h0's rank
    then ends on the closed connection (a lost peer) before anything started again: one interruption.
    A lost peer after the restart's workers started is a fault of its own."""
    from stalwart.diagnose.pipeline import interruptions

    def fd(ts, node, failure, attempt=0):
        return FailureDetected(
            ts=ts, failure=failure, evidence="", onset=ts - 1, step=17, rank=0, **_ctx(node, attempt)
        )

    def decided(ts, node, action, attempt=0):
        return DecisionTaken(ts=ts, action=action, reason="", **_ctx(node, attempt))

    hang, restart = fd(10.0, "h1", "hang"), decided(10.1, "h1", "restart")
    echo, own = fd(10.3, "h0", "peer_lost"), decided(10.4, "h0", "restart")
    started = decided(12.0, "h0", "start_warm", attempt=1)
    later = fd(20.0, "h0", "peer_lost", attempt=1)
    assert interruptions([hang, restart, echo, own, started, later]) == [[hang, echo], [later]]
    # the same host twice is two faults; another failure kind is its own fault; a start ends the echo
    again = fd(10.3, "h1", "peer_lost")
    assert interruptions([hang, restart, again]) == [[hang], [again]]
    crash = fd(10.3, "h0", "exception")
    assert interruptions([hang, restart, crash]) == [[hang], [crash]]
    assert interruptions([hang, restart, decided(10.2, "h0", "start_warm"), echo]) == [[hang], [echo]]
