"""The job runner (launch/runner.py) over the fakes of its ports (launch/fakes.py) on a manual clock:
it carries out the job policy's decisions and nothing else."""

from __future__ import annotations

import signal

from stalwart.events import DecisionTaken, JobEnded
from stalwart.exit_codes import EXIT_INFRA, EXIT_OK, EXIT_PREEMPTED
from stalwart.launch.clock import ManualClock
from stalwart.launch.decision import AttemptOutcome
from stalwart.launch.fakes import (
    FakeGate,
    FakeRendezvous,
    FakeRunFiles,
    RecordingLedger,
    ScriptedWorkers,
    SignalLatch,
)
from stalwart.launch.runner import SPARE_POLL_S, JobRunner
from stalwart.policy import job
from stalwart.policy.job import AttemptStatus, End, JobSpec, Replace, Restart, Shrink, StandBy
from stalwart.policy.restart_policy import Failure, RestartBudget
from stalwart.policy.vocabulary import FailureKind

T0 = 1_000_000.0


def crash(attempt: int, progressed: bool = True) -> AttemptOutcome:
    f = Failure(FailureKind.CRASH, attempt, 3, 0, "killed by SIGKILL", progressed=progressed)
    return AttemptOutcome(AttemptStatus.FAILED, f)


def runner(rounds, workers, *, node="n0", files=None, gate=None, signal_of=None, **spec) -> JobRunner:
    ledger = RecordingLedger(run_id="r", node=node)
    r = JobRunner(
        state=job.initial(JobSpec(node=node, **spec)),
        rendezvous=FakeRendezvous(rounds) if not isinstance(rounds, FakeRendezvous) else rounds,
        workers=workers,
        files=files or FakeRunFiles(),
        ledger=ledger,
        clock=ManualClock(T0),
        signal=signal_of or (lambda: None),
        gate=gate or FakeGate(),
        on_attempt=lambda attempt: setattr(ledger, "attempt", attempt),
    )
    return r


def decisions(r: JobRunner) -> list[DecisionTaken]:
    return r.ledger.of(DecisionTaken)  # type: ignore[attr-defined]


def verdict(r: JobRunner) -> JobEnded:
    (ended,) = r.ledger.of(JobEnded)  # type: ignore[attr-defined]
    return ended


def test_a_clean_run_is_one_round_one_attempt_and_a_verdict():
    w = ScriptedWorkers([AttemptOutcome(AttemptStatus.SUCCEEDED)])
    r = runner([("n0",)], w)
    assert r.run() == EXIT_OK
    assert w.started == [(0, ("n0",))]
    v = verdict(r)
    assert v.outcome == "succeeded" and v.attempt == 0 and v.requeue_helps is False
    assert "after 1 attempt, 0 failures recovered" in v.verdict


def test_failures_restart_until_the_budget_is_used_up_each_decision_under_its_attempt():
    w = ScriptedWorkers([crash(0), crash(1), crash(2)])
    r = runner([("n0",)] * 3, w, budget=RestartBudget(max_restarts=2))
    assert r.run() == EXIT_INFRA
    assert [a for a, _ in w.started] == [0, 1, 2]
    assert [(d.action, d.attempt, d.restarts_used) for d in decisions(r)] == [
        ("restart", 0, 1),
        ("restart", 1, 2),
        ("stop", 2, 2),
    ]
    v = verdict(r)
    assert v.outcome == "infra_exhausted" and v.attempt == 2 and v.requeue_helps


def test_a_back_off_waits_on_the_clock_before_the_next_round():
    w = ScriptedWorkers([crash(0, False), crash(1, False), AttemptOutcome(AttemptStatus.SUCCEEDED)])
    r = runner([("n0",)] * 3, w, budget=RestartBudget(max_restarts=5, backoff_base_s=4.0))
    assert r.run() == EXIT_OK
    assert r.clock.slept == [4.0]  # type: ignore[attr-defined]  # the second failure without progress


def test_the_newest_good_checkpoint_is_read_only_for_the_verdicts_that_name_it():
    files = FakeRunFiles(newest=8)
    r = runner([("n0",)], ScriptedWorkers([AttemptOutcome(AttemptStatus.PREEMPTED, step=10)]), files=files)
    assert r.run() == EXIT_INFRA
    assert (
        files.asked == 1 and "does not verify on disk; newest good checkpoint: step 8" in verdict(r).verdict
    )
    files = FakeRunFiles(newest=8)
    r = runner([("n0",)], ScriptedWorkers([AttemptOutcome(AttemptStatus.SUCCEEDED)]), files=files)
    r.run()
    assert files.asked == 0


def test_the_signal_names_the_preemption_of_a_script_without_the_sdk():
    latch = SignalLatch(signal.SIGUSR1, at=1)  # arrives after the round formed
    r = runner([("n0",)], ScriptedWorkers([AttemptOutcome(AttemptStatus.STOPPED)]), signal_of=latch)
    assert r.run() == EXIT_PREEMPTED
    assert "preempted by SIGUSR1" in verdict(r).verdict


def test_a_signal_before_the_start_starts_nothing():
    w = ScriptedWorkers([])
    r = runner([("n0",)], w, signal_of=lambda: signal.SIGTERM)
    assert r.run() == EXIT_PREEMPTED and w.started == []
    assert verdict(r).verdict == "stopped by SIGTERM before start"


def test_an_unhealthy_node_leaves_before_the_rendezvous():
    rdzv = FakeRendezvous([("n0",)])
    r = runner(rdzv, ScriptedWorkers([]), gate=FakeGate({0: ("xid 79", "quarantined")}))
    assert r.run() == EXIT_INFRA
    assert rdzv.met == [] and r.ended is not None and r.ended.left
    assert [d.action for d in decisions(r)] == ["exclude_node"]


def test_the_gate_is_asked_again_before_each_restart():
    gate = FakeGate({1: ("gpu fell off the bus", "quarantined")})
    r = runner([("n0",)] * 2, ScriptedWorkers([crash(0)]), gate=gate)
    assert r.run() == EXIT_INFRA and verdict(r).outcome == "node_unhealthy" and verdict(r).attempt == 1


def test_a_rendezvous_that_raises_ends_the_job_with_its_first_line():
    r = runner([TimeoutError("join timed out\nmore")], ScriptedWorkers([]))
    assert r.run() == EXIT_INFRA
    assert verdict(r).verdict == "rendezvous failed: TimeoutError: join timed out"


def test_an_agent_whose_store_went_with_a_job_that_succeeded_elsewhere_exits_0():
    files = FakeRunFiles(
        finished="the job already succeeded on h0 at 10:45:07 (the run directory's ledger says so)"
    )
    r = runner([TimeoutError("the store is gone")], ScriptedWorkers([]), files=files)
    assert r.run() == EXIT_OK
    assert verdict(r).outcome == "succeeded" and verdict(r).verdict.startswith(
        "the job already succeeded on h0"
    )


def test_membership_re_forms_and_the_next_round_decides_the_world():
    w = ScriptedWorkers([AttemptOutcome(AttemptStatus.MEMBERSHIP), AttemptOutcome(AttemptStatus.SUCCEEDED)])
    r = runner([("a", "b"), ("a", "b", "c", "d")], w, node="a", max_nodes=4)
    assert r.run() == EXIT_OK
    assert w.started == [(0, ("a", "b")), (1, ("a", "b", "c", "d"))]
    assert [d.action for d in decisions(r)] == ["restart"]


def test_a_lost_node_replaced_by_a_hot_spare_keeps_the_world_size():
    w = ScriptedWorkers([crash(0), AttemptOutcome(AttemptStatus.SUCCEEDED)])
    r = runner([("a", "b", "c"), ("a", "c")], w, node="a", max_nodes=2)
    assert r.run() == EXIT_OK
    assert w.started == [(0, ("a", "b")), (1, ("a", "c"))]
    assert any(isinstance(d, Replace) for d in r.decided)


def test_a_lost_node_without_a_spare_shrinks_the_world():
    w = ScriptedWorkers([crash(0), AttemptOutcome(AttemptStatus.SUCCEEDED)])
    r = runner([("a", "b", "c", "d"), ("a", "b", "c")], w, node="a", max_nodes=4)
    assert r.run() == EXIT_OK
    assert w.started == [(0, ("a", "b", "c", "d")), (1, ("a", "b"))]
    assert any(isinstance(d, Shrink) for d in r.decided)


def test_a_hot_spare_polls_on_the_clock_and_leaves_when_the_job_is_done():
    rdzv = FakeRendezvous([("a", "b", "c")], done_at=3)
    w = ScriptedWorkers([])
    r = runner(rdzv, w, node="c", max_nodes=2)
    assert r.run() == EXIT_OK and w.started == []
    assert r.clock.slept == [SPARE_POLL_S, SPARE_POLL_S]  # type: ignore[attr-defined]
    assert isinstance(r.decided[0], StandBy) and [d.action for d in decisions(r)] == ["standby"]
    assert verdict(r).verdict == "the job finished while this node stood by as a hot spare"


def test_a_hot_spare_steps_in_when_the_group_re_forms():
    rdzv = FakeRendezvous([("a", "b", "c"), ("a", "c")], waiting_at=2)
    w = ScriptedWorkers([AttemptOutcome(AttemptStatus.SUCCEEDED)])
    r = runner(rdzv, w, node="c", max_nodes=2)
    assert r.run() == EXIT_OK
    assert w.started == [(1, ("a", "c"))]
    assert [type(d) for d in r.decided] == [StandBy, Restart, Replace, End]


def test_a_hot_spare_that_takes_a_lost_nodes_place_in_place_runs_that_attempt_without_a_new_round():
    from dataclasses import replace

    from stalwart.policy.job import TookOver

    polls = []

    def takes_over(plan):
        polls.append(plan)
        if len(polls) < 3:
            return None
        return TookOver(replace(plan, active=("a", "c"), spares=()), "node b is lost")

    rdzv = FakeRendezvous([("a", "b", "c")])
    w = ScriptedWorkers([AttemptOutcome(AttemptStatus.SUCCEEDED)], takes_over=takes_over)
    r = runner(rdzv, w, node="c", max_nodes=2)
    assert r.run() == EXIT_OK
    assert w.started == [(0, ("a", "c"))]  # the same round: no re-rendezvous, the attempt it stood by in
    assert [type(d) for d in r.decided] == [StandBy, Replace, End]
    assert [d.action for d in decisions(r)] == ["standby", "take_over"]
    assert verdict(r).exit_code == EXIT_OK and "hot spare" not in verdict(r).verdict


def test_a_hot_spare_whose_store_goes_away_aborts():
    rdzv = FakeRendezvous([("a", "b", "c")], lost_at=1)
    r = runner(rdzv, ScriptedWorkers([]), node="c", max_nodes=2)
    assert r.run() == EXIT_INFRA and verdict(r).verdict == "hot spare stopped: store_lost"


def test_an_excluded_straggler_leaves_the_rendezvous_open():
    r = runner(
        [("a", "b")],
        ScriptedWorkers([AttemptOutcome(AttemptStatus.EXCLUDED, detail="slow")]),
        node="b",
        max_nodes=2,
    )
    assert r.run() == EXIT_INFRA
    assert r.ended is not None and r.ended.left and verdict(r).outcome == "node_excluded"


def test_what_the_job_started_is_stopped_before_the_verdict_so_the_verdict_is_the_last_event():
    # a final diagnosis round used to write its incident after the verdict, outside the job's wall time
    w = ScriptedWorkers([crash(0), crash(1)])
    r = runner([("n0",)] * 2, w, budget=RestartBudget(max_restarts=1))
    seen: list[tuple[str, int]] = []

    def closing(end: End) -> None:
        seen.append((end.outcome, len(r.ledger.of(JobEnded))))  # type: ignore[attr-defined]

    r.closing = closing
    assert r.run() == EXIT_INFRA
    assert seen == [("infra_exhausted", 0)]
    assert verdict(r).outcome == "infra_exhausted"
