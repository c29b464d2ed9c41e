"""A run that spans jobs: preempted, requeued, resumed. The gap between jobs is queue time."""

from __future__ import annotations

import pytest

from stalwart.account.goodput import BUCKETS, compute, job_windows
from stalwart.events import (
    AttemptStarted,
    CheckpointCommitted,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)

RUN = "r1"


def steps(attempt: int, first: int, starts: list[float]) -> list[StepCompleted]:
    return [
        StepCompleted(
            ts=t + 1.0, run_id=RUN, node="n0", attempt=attempt, rank=0, step=first + i, start=t, duration=1.0
        )
        for i, t in enumerate(starts)
    ]


def requeued_run() -> list:
    """Job 1: start 0, steps 0-3 from t=1, emergency checkpoint at 5.2, preempted at 5.5.
    Queue 5.5 -> 105. Job 2: start 105, resume at step 4, steps 4-6 from 106, ends at 109.5."""
    ev = [
        JobStarted(ts=0.0, run_id=RUN, node="n0", attempt=0, script="t.py"),
        AttemptStarted(ts=0.2, run_id=RUN, node="n0", attempt=0, world_size=2),
    ]
    ev += steps(0, 0, [1.0, 2.0, 3.0, 4.0])
    ev += [
        CheckpointCommitted(ts=5.2, run_id=RUN, node="n0", attempt=0, rank=0, step=4, path="c4", stall_s=0.2),
        JobEnded(
            ts=5.5,
            run_id=RUN,
            node="n0",
            attempt=0,
            verdict="preempted",
            outcome="preempted",
            exit_code=76,
            requeue_helps=True,
        ),
        JobStarted(ts=105.0, run_id=RUN, node="n0", attempt=0, script="t.py"),
        AttemptStarted(ts=105.2, run_id=RUN, node="n0", attempt=0, world_size=2),
        TrainingResumed(ts=105.8, run_id=RUN, node="n0", attempt=0, rank=0, step=4),
    ]
    ev += steps(0, 4, [106.0, 107.0, 108.0])
    ev.append(
        JobEnded(
            ts=109.5,
            run_id=RUN,
            node="n0",
            attempt=0,
            verdict="done",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
        )
    )
    return ev


def test_the_gap_between_jobs_is_queue_time_not_productive():
    g = compute(requeued_run())
    assert g.buckets["queue"] == pytest.approx(105.0 - 5.5)
    assert g.buckets["productive"] == pytest.approx(4.0 + 3.0)  # the steps of both jobs, nothing of the gap
    assert sum(g.buckets[b] for b in BUCKETS) == pytest.approx(g.wall_s)
    assert g.goodput == pytest.approx(g.buckets["productive"] / 109.5)
    assert g.jobs == 2 and g.preemptions == (5.5,)


def test_one_job_has_no_queue():
    ev = [e for e in requeued_run() if e.ts <= 5.5]
    g = compute(ev)
    assert g.buckets["queue"] == 0.0 and g.jobs == 1


def test_agents_of_one_job_overlap_into_one_window():
    starts = [
        JobStarted(ts=0.0, run_id=RUN, node="a", script="t.py"),
        JobStarted(ts=0.3, run_id=RUN, node="b", script="t.py"),
    ]
    ends = [
        JobEnded(
            ts=9.0, run_id=RUN, node="b", verdict="", outcome="succeeded", exit_code=0, requeue_helps=False
        ),
        JobEnded(
            ts=10.0, run_id=RUN, node="a", verdict="", outcome="succeeded", exit_code=0, requeue_helps=False
        ),
    ]
    assert job_windows(starts, ends) == [(0.0, 10.0)]


def _ended(ts: float, node: str, outcome: str, code: int) -> JobEnded:
    return JobEnded(
        ts=ts,
        run_id=RUN,
        node=node,
        verdict=outcome,
        outcome=outcome,
        exit_code=code,
        requeue_helps=code == 75,
    )


def test_a_killed_agent_ends_its_job_with_its_last_event_not_with_the_next_jobs_end():
    """The sbatch template's requeue (tests/e2e/test_slurm_sbatch.py): the agent of n0 is SIGKILLed
    (no JobEnded), n1's ends 75, and the requeued job runs on the same two nodes. n0's first window
    used to end at the JobEnded of its requeued agent: the two jobs were one, and the gap between them
    was not queue time."""
    ev = [JobStarted(ts=0.0, run_id=RUN, node=n, attempt=0, script="t.py") for n in ("n0", "n1")]
    ev += [AttemptStarted(ts=0.2, run_id=RUN, node="n0", attempt=0, world_size=2)]
    ev += steps(0, 0, [1.0, 2.0, 3.0, 4.0])  # n0's rank 0; its last word at 5.0, then SIGKILL
    ev += [_ended(6.0, "n1", "rendezvous_failed", 75)]
    ev += [JobStarted(ts=105.0, run_id=RUN, node=n, attempt=0, script="t.py") for n in ("n0", "n1")]
    ev += [
        AttemptStarted(ts=105.2, run_id=RUN, node="n0", attempt=0, world_size=2),
        TrainingResumed(ts=105.8, run_id=RUN, node="n0", attempt=0, rank=0, step=4),
    ]
    ev += steps(0, 4, [106.0, 107.0, 108.0])
    ev += [_ended(109.5, "n0", "succeeded", 0), _ended(109.5, "n1", "succeeded", 0)]
    starts = [e for e in ev if isinstance(e, JobStarted)]
    ends = [e for e in ev if isinstance(e, JobEnded)]
    assert job_windows(starts, ends, ev) == [(0.0, 6.0), (105.0, 109.5)]
    assert job_windows(starts, ends) == [(0.0, 109.5)]  # without the events: the old reading
    g = compute(ev)
    assert g.jobs == 2 and g.buckets["queue"] == pytest.approx(105.0 - 6.0)
    assert sum(g.buckets[b] for b in BUCKETS) == pytest.approx(g.wall_s)
