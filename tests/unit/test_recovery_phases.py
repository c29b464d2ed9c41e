"""Recovery path and phases per interruption, from hand-built ledger events."""

from __future__ import annotations

import dataclasses

import pytest

from stalwart.account.recovery import recoveries
from stalwart.account.reliability import interruptions_from_events, mttr
from stalwart.events import (
    DecisionTaken,
    FailureDetected,
    ReformedInPlace,
    StepCompleted,
    TrainingResumed,
    WorkersStarted,
    WorkersStopped,
)


def _attempt(a: int, t0: float, path: str, why: str) -> list:
    return [
        DecisionTaken(ts=t0, action=f"start_{path}", reason=f"{path}: {why}", attempt=a),
        WorkersStarted(ts=t0, pids=(1, 2), global_ranks=(0, 1), attempt=a),
        TrainingResumed(ts=t0 + 1.0, step=5, rank=0, attempt=a),
        TrainingResumed(ts=t0 + 1.5, step=5, rank=1, attempt=a),  # the last rank sets the phase end
        StepCompleted(ts=t0 + 1.7, step=5, start=t0 + 1.5, duration=0.2, rank=0, attempt=a),
        StepCompleted(ts=t0 + 1.8, step=5, start=t0 + 1.5, duration=0.3, rank=1, attempt=a),
        StepCompleted(ts=t0 + 2.0, step=6, start=t0 + 1.8, duration=0.2, rank=1, attempt=a),
    ]


def _crash_then_restart(path: str, why: str) -> list:
    """Attempt 0 runs, rank 1 crashes (onset 10.0), the group restarts on ``path`` at 10.75."""
    evs = _attempt(0, 0.0, "warm", "forked")
    evs += [
        FailureDetected(ts=10.3, failure="crash", evidence="x", onset=10.0, rank=1, attempt=0),
        WorkersStopped(ts=10.4, reason="rank 1 killed", attempt=0),
        DecisionTaken(ts=10.45, action="restart", reason="restart", attempt=0),
    ]
    return evs + _attempt(1, 10.75, path, why)


def test_phases_add_up_from_onset_to_the_first_step_of_every_rank():
    evs = _crash_then_restart("cold", "warm start failed (fork server is gone); started cold")
    [r] = recoveries(evs)
    assert (r.attempt, r.failure, r.rank, r.path) == (0, "crash", 1, "cold")
    assert "fork server is gone" in r.why
    expect = {"detect": 0.3, "tear_down": 0.1, "decide": 0.05, "re_form": 0.3, "load": 1.5, "first_step": 0.3}
    assert r.phases == pytest.approx(expect)
    assert r.total_s == pytest.approx(12.55 - 10.0)


def test_the_mttr_ends_where_the_table_does_at_every_ranks_first_step():
    # the two ranks' first steps land 0.1 s apart: the MTTR and the table both end at the later one
    evs = _crash_then_restart("warm", "forked")
    [r] = recoveries(evs)
    (i,) = interruptions_from_events(evs).interruptions
    assert mttr([i]).total_s == pytest.approx(r.total_s) == pytest.approx(12.55 - 10.0)


def test_a_failure_that_stopped_the_run_is_no_recovery_and_missing_events_give_none():
    stop = [
        FailureDetected(ts=5.0, failure="user_error", evidence="x", onset=4.9, rank=0, attempt=0),
        DecisionTaken(ts=5.1, action="stop", reason="stop", attempt=0),
    ]
    assert recoveries(stop) == []
    nosdk = [
        FailureDetected(ts=5.0, failure="crash", evidence="x", onset=4.9, rank=0, attempt=0),
        DecisionTaken(ts=5.1, action="restart", reason="restart", attempt=0),
        DecisionTaken(ts=5.2, action="start_warm", reason="warm: forked", attempt=1),
        WorkersStarted(ts=5.2, pids=(1,), global_ranks=(0,), attempt=1),
    ]
    [r] = recoveries(nosdk)
    assert r.path == "warm" and r.phases["tear_down"] is None and r.phases["load"] is None
    assert r.phases["re_form"] == pytest.approx(0.1) and r.total_s is None


def _in_place_run(lost_steps: int = 0) -> list:
    evs = _attempt(0, 0.0, "warm", "forked")
    evs += [
        StepCompleted(ts=9.0, step=16, start=8.8, duration=0.2, rank=0, attempt=0, node="n"),
        FailureDetected(ts=10.2, failure="crash", evidence="x", onset=10.0, rank=2, attempt=0),
        DecisionTaken(ts=10.25, action="in_place", reason="rank 2 (crash) replaced in place", attempt=0),
        ReformedInPlace(
            ts=11.0,
            generation=1,
            ranks=(2,),
            step=17,
            lost_steps=lost_steps,
            bytes_moved=100,
            state_bytes=100,
            phases={"abort": 0.05, "replace": 0.1, "wait": 0.1, "rendezvous": 0.3, "transfer": 0.2},
            attempt=0,
        ),
        StepCompleted(ts=11.3, step=17, start=11.0, duration=0.3, rank=0, attempt=0, node="n"),
        StepCompleted(ts=11.4, step=17, start=11.0, duration=0.4, rank=2, attempt=0, node="n"),
    ]
    return evs


def test_an_in_place_recovery_has_its_own_path_and_phases_from_its_record():
    [r] = recoveries(_in_place_run())
    assert (r.path, r.rank) == ("in-place", 2) and "replaced in place" in r.why
    expect = {
        "detect": 0.2,
        "tear_down": 0.05,
        "decide": 0.05,
        "re_form": 0.5,
        "load": 0.2,
        "first_step": 0.4,
    }
    assert r.phases == pytest.approx(expect)


def test_an_in_place_recovery_recorded_late_by_a_starved_agent_still_ends_at_every_ranks_first_step():
    """The steps carry their ranks' own time, the re-formation the agent's: an agent woken late on a
    loaded machine records the re-formation after the ranks stepped again (hog CI run 20)."""
    evs = [
        e if not isinstance(e, ReformedInPlace) else dataclasses.replace(e, ts=12.0) for e in _in_place_run()
    ]
    [r] = recoveries(sorted(evs, key=lambda e: e.ts))
    assert r.ended == pytest.approx(11.4) and r.total_s is not None  # rank 2's first step: every rank's
    assert r.phases["first_step"] == 0.0  # recorded after it: no negative phase


def test_an_in_place_rung_that_failed_is_named_in_the_whole_group_recovery():
    evs = _attempt(0, 0.0, "warm", "forked")
    evs += [
        FailureDetected(ts=10.3, failure="crash", evidence="x", onset=10.0, rank=1, attempt=0),
        DecisionTaken(ts=10.32, action="in_place", reason="rank 1 replaced in place", attempt=0),
        DecisionTaken(ts=12.0, action="in_place_failed", reason="rank 0 exited during it", attempt=0),
        WorkersStopped(ts=12.1, reason="in-place recovery failed", attempt=0),
        DecisionTaken(ts=12.2, action="restart", reason="restart", attempt=0),
    ]
    evs += _attempt(1, 12.5, "warm", "forked")
    [r] = recoveries(evs)
    assert r.path == "warm" and "in-place not taken (rank 0 exited during it)" in r.why
