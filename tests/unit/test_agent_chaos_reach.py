"""The agent's side of chaos for unchanged scripts: checkpoint damage is refused at the first step a
rank takes without a Session, and the planned faults that never fired are recorded at the end."""

from __future__ import annotations

import pytest

from stalwart.chaos.plan import build_plan
from stalwart.errors import FaultPlanError
from stalwart.events import ChaosInjected, ChaosUnfired, StepCompleted
from stalwart.launch.agent_chaos import AgentChaos
from stalwart.launch.clock import ManualClock
from stalwart.launch.fakes import RecordingLedger
from stalwart.launch.processes.bootstrap import HOOK_SECTION
from stalwart.launch.progress import ProgressTracker
from stalwart.protocol import Hello, StepDone
from stalwart.protocol.run_dir import RunDir


def _chaos(tmp_path, *specs: str) -> tuple[AgentChaos, RecordingLedger]:
    ledger = RecordingLedger()
    return AgentChaos(build_plan(list(specs)), RunDir(tmp_path / "run"), ledger, ManualClock()), ledger


def _hooked_step(rank: int, step: int) -> StepDone:
    return StepDone(rank, step, 1.0, 0.1, {HOOK_SECTION: 0.01})


def test_checkpoint_damage_is_refused_at_the_first_step_of_a_rank_without_a_session(tmp_path):
    chaos, _ = _chaos(tmp_path, "corrupt-checkpoint@step=5")
    tracker = ProgressTracker(ranks=[0, 1], started=0.0)
    chaos.tick(tracker)  # no step yet: nothing known about the script
    tracker.observe(_hooked_step(1, 0), 1.1)
    with pytest.raises(FaultPlanError) as err:
        chaos.tick(tracker)
    assert (
        "'corrupt-checkpoint@step=5' needs the Stalwart SDK (Session), but rank 1 steps without one"
        in str(err.value)
    )
    assert err.value.exit_code == 2


def test_a_session_script_takes_checkpoint_damage(tmp_path):
    chaos, _ = _chaos(tmp_path, "corrupt-checkpoint@step=5")
    tracker = ProgressTracker(ranks=[0], started=0.0)
    tracker.observe(Hello(0, 1.0), 1.0)
    tracker.observe(_hooked_step(0, 0), 1.1)  # the hooks' record of a Session's rank: dropped
    tracker.observe(StepDone(0, 0, 1.0, 0.1, {"forward": 0.05}), 1.1)
    chaos.tick(tracker)


def test_step_faults_on_an_unchanged_script_are_not_refused(tmp_path):
    chaos, _ = _chaos(tmp_path, "crash@rank=1,step=5", "kill-agent@node=0,step=50")
    tracker = ProgressTracker(ranks=[0, 1], started=0.0)
    tracker.observe(_hooked_step(1, 0), 1.1)
    chaos.tick(tracker)


def test_the_faults_that_never_fired_are_recorded_once_with_the_runs_last_step(tmp_path):
    chaos, ledger = _chaos(tmp_path, "crash@rank=1,step=5", "crash@rank=0,step=500")
    events = [
        ChaosInjected(ts=1.0, rank=1, fault="crash", step=5),
        StepCompleted(ts=2.0, rank=0, step=19, start=1.9, duration=0.1),
    ]
    line = chaos.account(events)
    assert line.startswith("chaos: 1 planned fault(s) never fired: 'crash@rank=0,step=500'")
    assert "last step was 19" in line
    [ev] = ledger.of(ChaosUnfired)
    assert ev.faults == ("crash@rank=0,step=500",) and ev.line == line


def test_nothing_is_recorded_when_every_fault_fired(tmp_path):
    chaos, ledger = _chaos(tmp_path, "crash@rank=1,step=5")
    assert chaos.account([ChaosInjected(ts=1.0, rank=1, fault="crash", step=5)]) == ""
    assert not ledger.of(ChaosUnfired)
