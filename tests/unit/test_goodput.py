"""Goodput buckets from hand-built ledgers: every second of wall time lands in exactly one bucket."""

from __future__ import annotations

import dataclasses

import pytest

from stalwart.account.goodput import BUCKETS, compute, ideal_step_time
from stalwart.errors import LedgerError
from stalwart.events import (
    AttemptStarted,
    CheckpointCommitted,
    CheckpointLoaded,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)

RUN = "r1"


def steps(
    attempt: int, first: int, starts: list[float], dur: float = 1.0, rank: int = 0
) -> list[StepCompleted]:
    return [
        StepCompleted(
            ts=t + dur,
            run_id=RUN,
            node="n0",
            attempt=attempt,
            rank=rank,
            step=first + i,
            start=t,
            duration=dur,
        )
        for i, t in enumerate(starts)
    ]


def crash_run() -> list:
    """Attempt 0: steps 0-4 from t=2, checkpoint (0.5 s stall) at 7.5, steps 5-7, crash at 11.0.
    Attempt 1: restore 12.0-12.5, steps 5-9 from t=13, job ends at 19."""
    ev = [
        JobStarted(ts=0.0, run_id=RUN, node="n0", attempt=0, script="t.py"),
        AttemptStarted(ts=0.5, run_id=RUN, node="n0", attempt=0, world_size=2),
    ]
    ev += steps(0, 0, [2.0, 3.0, 4.0, 5.0, 6.0])
    ev.append(
        CheckpointCommitted(ts=7.5, run_id=RUN, node="n0", attempt=0, rank=0, step=5, path="c5", stall_s=0.5)
    )
    ev += steps(0, 5, [7.5, 8.5, 9.5])
    ev += [
        FailureDetected(
            ts=11.2,
            run_id=RUN,
            node="n0",
            attempt=0,
            rank=1,
            failure="crash",
            evidence="killed by SIGKILL",
            onset=11.0,
            step=8,
        ),
        DecisionTaken(ts=11.3, run_id=RUN, node="n0", attempt=0, action="restart", reason="restart"),
        AttemptStarted(ts=11.5, run_id=RUN, node="n0", attempt=1, world_size=2),
        CheckpointLoaded(
            ts=12.5, run_id=RUN, node="n0", attempt=1, rank=0, step=5, path="c5", duration_s=0.5
        ),
        TrainingResumed(ts=12.5, run_id=RUN, node="n0", attempt=1, rank=0, step=5),
    ]
    ev += steps(1, 5, [13.0, 14.0, 15.0, 16.0, 17.0])
    ev.append(
        JobEnded(
            ts=19.0,
            run_id=RUN,
            node="n0",
            attempt=1,
            verdict="done",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
        )
    )
    return ev


def test_buckets_of_a_run_with_one_crash():
    g = compute(crash_run())
    b = g.buckets
    assert set(b) == set(BUCKETS)
    assert g.wall_s == 19.0 and g.finished and g.outcome == "succeeded"
    assert sum(b.values()) == pytest.approx(g.wall_s, abs=1e-9)
    expected = {
        "startup": 2.0,
        "productive": 10.0,
        "checkpoint_stall": 0.5,
        "lost_work": 3.5,
        "detection": 0.2,
        "checkpoint_restore": 0.5,
        "restart": 1.3,
        "shutdown": 1.0,
        "straggler_slowdown": 0.0,
        "other": 0.0,
    }
    for name, value in expected.items():
        assert b[name] == pytest.approx(value, abs=1e-9), name
    assert g.goodput == pytest.approx(10.0 / 19.0)
    assert g.steps_completed == 10 and g.ideal_step_s == 1.0


def test_lost_work_of_a_crash_is_onset_minus_the_last_commit():
    (cost,) = compute(crash_run()).interruptions
    assert cost.lost_since == 7.5 and cost.lost_work_s == pytest.approx(11.0 - 7.5)
    assert cost.detection_s == pytest.approx(0.2) and cost.recovery_s == pytest.approx(13.0 - 11.2)
    assert cost.total_s == pytest.approx(3.5 + 0.2 + 1.8) and cost.failure == "crash" and cost.rank == 1


def test_a_crash_while_the_checkpoint_it_resumes_from_is_being_taken_loses_no_work():
    # rank 1 dies at 7.45, during the step-5 save's stall; rank 0's snapshot completes at 7.5 and the
    # next attempt resumes from it. Every completed step survived: no work is lost (the report booked
    # the whole attempt as lost because the snapshot came after the onset)
    ev = []
    for e in crash_run():
        if isinstance(e, StepCompleted) and e.attempt == 0 and e.step >= 5:
            continue
        if isinstance(e, FailureDetected):
            e = dataclasses.replace(e, onset=7.45, ts=7.65, step=5)
        ev.append(e)
    g = compute(ev)
    (cost,) = g.interruptions
    assert cost.lost_since == 7.45 and cost.lost_work_s == 0.0
    assert g.buckets["lost_work"] == 0.0 and g.buckets["productive"] == pytest.approx(10.0)
    assert sum(g.buckets.values()) == pytest.approx(g.wall_s, abs=1e-9)


def test_crash_without_a_checkpoint_loses_the_whole_attempt():
    ev = [e for e in crash_run() if not isinstance(e, CheckpointCommitted | CheckpointLoaded)]
    g = compute(ev)
    (cost,) = g.interruptions
    assert cost.lost_since == 2.0 and cost.lost_work_s == pytest.approx(9.0)
    assert g.buckets["lost_work"] == pytest.approx(9.0) and g.buckets["checkpoint_stall"] == 0.0
    assert sum(g.buckets.values()) == pytest.approx(g.wall_s, abs=1e-9)


def test_other_ranks_steps_do_not_change_the_timeline():
    base = compute(crash_run())
    other = compute(crash_run() + steps(0, 0, [2.1, 3.3, 4.2], dur=1.4, rank=1))
    assert other.buckets == base.buckets


def test_slow_step_excess_goes_to_straggler_slowdown():
    ev = [JobStarted(ts=0.0, run_id=RUN, script="t.py")]
    ev += steps(0, 0, [1.0, 2.0, 3.0, 4.0])
    ev += [StepCompleted(ts=8.0, run_id=RUN, node="n0", attempt=0, rank=0, step=4, start=5.0, duration=3.0)]
    ev += steps(0, 5, [8.0, 9.0, 10.0, 11.0])
    ev.append(
        JobEnded(ts=12.0, run_id=RUN, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False)
    )
    g = compute(ev)
    assert g.ideal_step_s == 1.0
    assert g.buckets["straggler_slowdown"] == pytest.approx(2.0)
    assert g.buckets["productive"] == pytest.approx(9.0)
    assert g.buckets["startup"] == pytest.approx(1.0)
    assert sum(g.buckets.values()) == pytest.approx(12.0, abs=1e-9)
    # a step within slow_factor x ideal is not a straggler
    assert compute(ev, slow_factor=3.5).buckets["straggler_slowdown"] == 0.0


def test_ideal_step_time_ignores_outliers():
    assert ideal_step_time([1.0, 1.0, 1.0, 1.0, 10.0]) == 1.0
    d = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 30.0]
    # median 1.0, MAD 0.05 -> keep <= 1.15: the 30 s restart step is dropped
    assert ideal_step_time(d) == pytest.approx(sum(d[:-1]) / 6)
    assert ideal_step_time([]) == 0.0


def test_empty_ledger_or_no_job_start_is_a_ledger_error():
    with pytest.raises(LedgerError, match="no events"):
        compute([])
    with pytest.raises(LedgerError, match="no JobStarted"):
        compute(steps(0, 0, [1.0, 2.0]))


def test_unfinished_run_ends_at_its_last_event():
    ev = [e for e in crash_run() if not isinstance(e, JobEnded)]
    g = compute(ev)
    assert not g.finished and g.outcome == "running" and g.wall_s == 18.0
    assert sum(g.buckets.values()) == pytest.approx(18.0, abs=1e-9)


def test_crash_during_restart_loses_no_work():
    ev = [
        e
        for e in crash_run()
        if not (isinstance(e, StepCompleted) and e.attempt == 1) and not isinstance(e, JobEnded)
    ]
    # attempt 1 dies while restoring (before its first step); attempt 2 restores and runs 5-9
    ev += [
        FailureDetected(
            ts=12.9,
            run_id=RUN,
            node="n0",
            attempt=1,
            rank=0,
            failure="crash",
            evidence="killed by SIGKILL",
            onset=12.8,
            step=5,
        ),
        DecisionTaken(ts=13.0, run_id=RUN, node="n0", attempt=1, action="restart", reason="restart"),
        CheckpointLoaded(
            ts=14.0, run_id=RUN, node="n0", attempt=2, rank=0, step=5, path="c5", duration_s=0.5
        ),
        TrainingResumed(ts=14.0, run_id=RUN, node="n0", attempt=2, rank=0, step=5),
    ]
    ev += steps(2, 5, [14.5, 15.5, 16.5, 17.5, 18.5])
    ev.append(
        JobEnded(
            ts=20.0,
            run_id=RUN,
            node="n0",
            attempt=2,
            verdict="done",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
        )
    )
    g = compute(ev)
    first, second = g.interruptions
    assert first.lost_work_s == pytest.approx(3.5)
    assert second.lost_work_s == 0.0  # no step of attempt 1 ever ran
    assert g.buckets["lost_work"] == pytest.approx(3.5)


def test_an_in_place_recovery_loses_only_the_interrupted_step():
    """Same attempt throughout: steps 0-7, rank 1 lost at 11.0 in step 8, re-formed in place (the
    survivors' live state after 8 steps), step 8 redone from 12.0. Only the interrupted step is lost."""
    ev = [
        JobStarted(ts=0.0, run_id=RUN, node="n0", attempt=0, script="t.py"),
        AttemptStarted(ts=0.5, run_id=RUN, node="n0", attempt=0, world_size=2),
    ]
    ev += steps(0, 0, [2.0, 3.0, 4.0, 5.0, 6.0])
    ev.append(
        CheckpointCommitted(ts=7.5, run_id=RUN, node="n0", attempt=0, rank=0, step=5, path="c5", stall_s=0.5)
    )
    ev += steps(0, 5, [7.5, 8.5, 9.5])
    ev += [
        FailureDetected(
            ts=11.2,
            run_id=RUN,
            node="n0",
            attempt=0,
            rank=1,
            failure="crash",
            evidence="x",
            onset=11.0,
            step=8,
        ),
        DecisionTaken(ts=11.3, run_id=RUN, node="n0", attempt=0, action="in_place", reason="in place"),
        TrainingResumed(
            ts=11.9, run_id=RUN, node="n0", attempt=0, rank=0, step=8, from_checkpoint="live:rank0"
        ),
    ]
    ev += steps(0, 8, [12.0, 13.0])
    ev.append(
        JobEnded(
            ts=15.0, run_id=RUN, node="n0", attempt=0, verdict="done", outcome="succeeded", exit_code=0,
            requeue_helps=False,
        )
    )  # fmt: skip
    g = compute(ev)
    (cost,) = g.interruptions
    assert cost.lost_since == pytest.approx(10.5)  # the end of step 7: every completed step survived
    assert cost.lost_work_s == pytest.approx(0.5) and cost.recovery_s == pytest.approx(12.0 - 11.2)
    assert g.buckets["lost_work"] == pytest.approx(0.5) and g.buckets["productive"] == pytest.approx(10.0)


def test_an_unchanged_scripts_own_resume_point_keeps_the_steps_before_it():
    """No checkpoint on the ledger (the script saves its own): the resume point the step hooks told
    from the parameters (step 7 is the first step again) keeps steps 0-6; steps 7 and the crashed
    one are lost. The same resume from an SDK checkpoint missing from the ledger keeps nothing."""
    ev = [e for e in crash_run() if not isinstance(e, CheckpointCommitted | CheckpointLoaded)]
    ev = [
        dataclasses.replace(e, step=7, from_checkpoint="script:fingerprint: resumed at step 7")
        if isinstance(e, TrainingResumed)
        else e
        for e in ev
    ]
    (cost,) = compute(ev).interruptions
    assert cost.lost_since == pytest.approx(9.5)  # step 6 ended at 9.5
    assert cost.lost_work_s == pytest.approx(1.5)  # step 7 and the crashed step 8 until 11.0
    ev_sdk = [
        dataclasses.replace(e, from_checkpoint="c7") if isinstance(e, TrainingResumed) else e for e in ev
    ]
    (sdk,) = compute(ev_sdk).interruptions
    assert sdk.lost_since == 2.0
