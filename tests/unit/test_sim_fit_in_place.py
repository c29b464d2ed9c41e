"""Fitting a run whose failures were recovered by different mechanisms: the failures of one kind that
were recovered in place form a class of their own, with its own rate, detection and recovery, which
the replay never rolls back."""

import pytest

from stalwart.account.recovery import recovery_per_interruption
from stalwart.account.reliability import interruptions_from_events
from stalwart.events import (
    AttemptStarted,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    ReformedInPlace,
    StepCompleted,
    TrainingResumed,
    WorkersStarted,
    WorkersStopped,
)
from stalwart.sim import simulate
from stalwart.sim.config import make_config
from stalwart.sim.fit import check_feasible, fit_run, run_config, sim_failures

T0 = 1_700_000_000.0
STEP_S = 2.0


class _Run:
    """A hand-written two-rank run on one node: training steps, and failures recovered either in place
    (the attempt goes on, rank 1 is replaced) or by a warm restart of the whole group (a new attempt)."""

    def __init__(self) -> None:
        self.t, self.step, self.attempt, self.generation = T0, 0, 0, 0
        self.evs: list = [
            JobStarted(ts=T0, script="train.py", nproc_per_node=2, max_restarts=9, **self._ctx()),
            AttemptStarted(ts=T0, world_size=2, num_nodes=1, **self._ctx()),
            WorkersStarted(ts=T0, pids=(1, 2), global_ranks=(0, 1), **self._ctx()),
        ]
        self.train()

    def _ctx(self, attempt: int | None = None) -> dict:
        return dict(run_id="r", node="n0", attempt=self.attempt if attempt is None else attempt)

    def train(self, n: int = 5) -> None:
        for _ in range(n):
            for r in (0, 1):
                ts = self.t + STEP_S
                self.evs.append(
                    StepCompleted(ts=ts, rank=r, step=self.step, start=self.t, duration=STEP_S, **self._ctx())
                )
            self.t, self.step = self.t + STEP_S, self.step + 1

    def _first_step(self, took: float) -> None:
        for r in (0, 1):
            start = self.t - took
            self.evs.append(
                StepCompleted(ts=self.t, rank=r, step=self.step, start=start, duration=took, **self._ctx())
            )
        self.step += 1

    def _fail(self, detect: float, failure: str) -> None:
        self.evs.append(
            FailureDetected(
                ts=self.t + detect, failure=failure, evidence="SIGKILL", onset=self.t, rank=1, **self._ctx()
            )
        )
        self.t += detect

    def in_place(self, detect: float, decide: float, reform: float, first: float, failure: str = "crash"):
        """Rank 1 fails; it is replaced in place: decided, re-formed with the live state, first step."""
        self._fail(detect, failure)
        why = f"rank 1 ({failure}) replaced in place"
        self.evs.append(DecisionTaken(ts=self.t + decide, action="in_place", reason=why, **self._ctx()))
        self.t += decide + reform
        self.generation += 1
        phases = {"abort": 0.1, "replace": reform / 2, "wait": 0.0, "rendezvous": reform / 4, "transfer": 0.2}
        self.evs.append(
            ReformedInPlace(
                ts=self.t,
                generation=self.generation,
                ranks=(1,),
                step=self.step,
                lost_steps=0,
                bytes_moved=10,
                state_bytes=10,
                phases=phases,
                **self._ctx(),
            )
        )
        origin = "live:rank0"
        self.evs.append(
            TrainingResumed(ts=self.t, rank=0, step=self.step, from_checkpoint=origin, **self._ctx())
        )
        self.t += first
        self._first_step(first)
        self.train()

    def warm(self, detect: float, decide: float, reform: float, first: float, failure: str = "crash"):
        """Rank 1 fails; the whole group is restarted from forked standbys (a new attempt)."""
        self._fail(detect, failure)
        self.evs.append(WorkersStopped(ts=self.t + decide / 2, reason="rank 1 killed", **self._ctx()))
        self.evs.append(DecisionTaken(ts=self.t + decide, action="restart", reason="restart", **self._ctx()))
        self.t += decide
        self.attempt += 1
        self.evs.append(
            DecisionTaken(ts=self.t + 0.1, action="start_warm", reason="warm: forked", **self._ctx())
        )
        self.evs.append(AttemptStarted(ts=self.t + 0.1, world_size=2, num_nodes=1, **self._ctx()))
        self.evs.append(
            WorkersStarted(ts=self.t + reform / 2, pids=(3, 4), global_ranks=(0, 1), **self._ctx())
        )
        self.t += reform
        for r in (0, 1):
            self.evs.append(TrainingResumed(ts=self.t, rank=r, step=self.step, **self._ctx()))
        self.t += first
        self._first_step(first)
        self.train()

    def end(self) -> list:
        self.evs.append(
            JobEnded(ts=self.t + 1.0, verdict="done", outcome="succeeded", exit_code=0, requeue_helps=False)
        )
        return self.evs


def _mixed_run() -> list:
    """Five crashes recovered in place, three by warm restarts, one hang by a warm restart."""
    run = _Run()
    run.in_place(detect=0.5, decide=0.1, reform=1.0, first=2.0)
    run.warm(detect=1.0, decide=1.0, reform=10.0, first=3.0)
    run.in_place(detect=0.3, decide=0.1, reform=1.4, first=2.0)
    run.in_place(detect=0.4, decide=0.1, reform=0.6, first=2.0)
    run.warm(detect=2.0, decide=2.0, reform=14.0, first=3.0)
    run.in_place(detect=0.3, decide=0.1, reform=1.0, first=2.0)
    run.warm(detect=3.0, decide=1.5, reform=12.0, first=3.0, failure="hang")
    run.in_place(detect=0.5, decide=0.1, reform=1.0, first=2.0)
    run.warm(detect=1.5, decide=1.5, reform=8.0, first=3.0)
    return run.end()


def test_each_kind_is_split_by_whether_it_was_recovered_in_place():
    fit = fit_run(_mixed_run())
    by = {c.name: c for c in fit.classes}
    assert set(by) == {"crash", "crash (in place)", "hang"}
    placed, warm, hang = by["crash (in place)"], by["crash"], by["hang"]
    assert (placed.events, warm.events, hang.events) == (5, 3, 1)
    assert (placed.in_place, warm.in_place, hang.in_place) == (True, False, False)
    assert hang.hang and not placed.hang and not placed.node_loss
    # each class its own rate over the run's exposure; together the run's rate
    for c in fit.classes:
        assert c.per_node_hour == pytest.approx(c.events / fit.node_hours)
    assert sum(c.per_node_hour for c in fit.classes) == pytest.approx(fit.per_node_hour[0])
    # its own detection (onset -> detected) and recovery (detected -> training again: the first step's
    # start; that step is training, which the replay books as such, so it is not part of the restart)
    assert placed.detect_s == pytest.approx((0.5 + 0.3 + 0.4 + 0.3 + 0.5) / 5)
    assert warm.detect_s == pytest.approx((1.0 + 2.0 + 1.5) / 3)
    assert placed.restart_s == pytest.approx(0.1 + (1.0 + 1.4 + 0.6 + 1.0 + 1.0) / 5)
    assert warm.restart_s == pytest.approx((1.0 + 2.0 + 1.5) / 3 + (10.0 + 14.0 + 8.0) / 3)
    assert hang.restart_s == pytest.approx(1.5 + 12.0)
    # the MTTR the report shows still runs to the first step's end
    assert fit.recover_s > fit.resume_s


def test_a_run_without_in_place_recoveries_keeps_one_class_per_kind():
    run = _Run()
    run.warm(detect=1.0, decide=1.0, reform=10.0, first=3.0)
    run.warm(detect=2.0, decide=1.0, reform=12.0, first=3.0)
    [c] = fit_run(run.end()).classes
    assert (c.name, c.events, c.in_place) == ("crash", 2, False)
    assert c.restart_s == pytest.approx(1.0 + (10.0 + 12.0) / 2)  # to the first step's start


def test_the_replay_rolls_back_only_the_classes_not_recovered_in_place():
    fit = fit_run(_mixed_run())
    failures = {f["name"]: f for f in sim_failures(fit)}
    assert failures["crash (in place)"]["in_place"] and not failures["crash"]["in_place"]
    cfg = make_config(**run_config(fit, {}, trials=20))
    check_feasible(cfg, "measured")
    classes = {f.name: f for f in cfg.failures}
    assert classes["crash (in place)"].in_place and not classes["crash"].in_place
    fitted = {c.name: c.restart_s for c in fit.classes}
    assert {f.name: f.restart_s for f in cfg.failures} == pytest.approx(fitted)
    # the same replay with every class rolled back loses more work
    rolled = cfg.model_dump()
    rolled["failures"] = [{**f, "in_place": False} for f in rolled["failures"]]
    placed, back = simulate(cfg), simulate(make_config(**rolled))
    assert placed.buckets["lost_work"].mean() < back.buckets["lost_work"].mean()


def test_slow_steps_are_fitted_against_productive_time_and_replayed():
    from stalwart.account.goodput import compute

    steady = _Run()
    steady.in_place(detect=0.5, decide=0.1, reform=1.0, first=STEP_S)
    assert fit_run(steady.end()).slow_steps == 0.0
    run = _Run()
    run.in_place(detect=0.5, decide=0.1, reform=1.0, first=STEP_S)
    for _ in range(3):  # three steps at 4x the others
        for r in (0, 1):
            run.evs.append(
                StepCompleted(
                    ts=run.t + 4 * STEP_S,
                    rank=r,
                    step=run.step,
                    start=run.t,
                    duration=4 * STEP_S,
                    **run._ctx(),
                )
            )
        run.t, run.step = run.t + 4 * STEP_S, run.step + 1
    run.train()
    evs = run.end()
    b = compute(evs).buckets
    assert b["straggler_slowdown"] > 0
    fit = fit_run(evs)
    assert fit.slow_steps == pytest.approx(b["straggler_slowdown"] / b["productive"])
    assert run_config(fit, {}, 10)["slow_steps"] == fit.slow_steps


def test_a_warm_restarts_row_ends_before_a_later_recovery_in_place_in_its_attempt():
    # each warm row is its own detect + decide + re-form + first step; the in-place recoveries later in
    # the same attempt (replacements resumed from live state) are theirs, not the warm row's
    evs = _mixed_run()
    rows = recovery_per_interruption(evs)
    its = interruptions_from_events(evs).interruptions
    warm = [(r, i) for r, i in zip(rows, its, strict=True) if r is not None and r.path == "warm"]
    assert [r.total_s for r, _ in warm] == pytest.approx(
        [1 + 1 + 10 + 3, 2 + 2 + 14 + 3, 3 + 1.5 + 12 + 3, 1.5 + 1.5 + 8 + 3]
    )
    # and the MTTR of each is the same measurement
    assert [i.downtime_s for _, i in warm] == pytest.approx([r.total_s for r, _ in warm])
