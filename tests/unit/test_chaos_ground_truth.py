"""Every injected fault is a labelled fault of the precision and recall tables (issue 27)."""

from __future__ import annotations

from stalwart.chaos.plan import Fault
from stalwart.diagnose.precision import detector_stats
from stalwart.events import ChaosInjected, CheckpointRejected, StepCompleted, StragglerDetected
from stalwart.train.chaos_hook import ChaosHook


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _hook(fault: Fault, tmp_path, events: list) -> ChaosHook:
    return ChaosHook(
        (fault,),
        rank=3,
        chaos_dir=tmp_path / "chaos",
        emit=events.append,
        context={"run_id": "r", "node": "n0", "attempt": 0, "rank": 3},
        clock=_Clock(),
    )


def _steps(hook: ChaosHook, steps: range) -> None:
    for step in steps:
        hook.step_began(step)
        hook.section_ended(step, "data")
        hook.step_ended(step, 0.1)


def test_a_slow_span_is_recorded_once_per_run_with_its_span(tmp_path):
    slow = Fault("slow", rank=3, factor=1.6, start=30, stop=70)
    events: list = []
    _steps(_hook(slow, tmp_path, events), range(25, 45))
    assert [(e.fault, e.step, e.until_step, e.rank) for e in events] == [("slow", 30, 70, 3)]
    _steps(_hook(slow, tmp_path, events), range(30, 45))  # a restart resumes inside the span
    assert len(events) == 1


def test_the_demo_slow_rank_is_caught_even_when_found_long_after_it_began():
    # the demo's plan: slow@rank=3,factor=1.6,from=30,to=70 on a busy machine: step 70 ends 600 s
    # after the slowdown began, and the straggler detector, debounced over windows, fires at 450 s
    evs: list = [ChaosInjected(ts=100, node="n0", rank=3, fault="slow", step=30, until_step=70)]
    evs += [StepCompleted(ts=100 + (s - 30) * 15, rank=0, step=s, start=0, duration=1) for s in range(30, 90)]
    evs.append(StragglerDetected(ts=550, node="n0", rank=3, score=2.29, step=60, evidence="2.29x"))
    s = {x.detector: x for x in detector_stats(evs)}["straggler"]
    assert (s.firings, s.confirmed, s.faults, s.caught) == (1, 1, 1, 1)


def test_a_straggler_long_after_the_span_ended_is_not_confirmed_by_it():
    evs: list = [ChaosInjected(ts=100, node="n0", rank=3, fault="slow", step=30, until_step=70)]
    evs += [StepCompleted(ts=100 + (s - 30), rank=0, step=s, start=0, duration=1) for s in range(30, 90)]
    evs.append(StragglerDetected(ts=1000, node="n0", rank=3, score=2.0, step=400, evidence=""))
    s = {x.detector: x for x in detector_stats(evs)}["straggler"]
    assert (s.confirmed, s.caught) == (0, 0)


def test_checkpoint_damage_is_caught_by_the_verifying_load():
    evs = [
        ChaosInjected(ts=100, node="n0", fault="corrupt-checkpoint", step=146),
        CheckpointRejected(ts=130, node="n0", rank=0, path="ckpt/step-140", reason="checksum mismatch"),
        ChaosInjected(ts=400, node="n1", fault="truncate-checkpoint", step=200),  # never read back
    ]
    s = {x.detector: x for x in detector_stats(evs)}["checkpoint_verify"]
    assert (s.firings, s.confirmed, s.faults, s.caught) == (1, 1, 2, 1)
