"""``stalwart plan --ledger`` on a chaos run: injected faults are not a failure rate."""

from __future__ import annotations

from stalwart.commands.plan import _measured
from stalwart.events import (
    AttemptStarted,
    ChaosInjected,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from stalwart.ledger import LedgerWriter, read_merged
from stalwart.sim.config import make_config


def _write(run_dir, *, chaos: bool) -> None:
    t = 3_000_000.0
    evs = [
        JobStarted(ts=t, script="x"),
        AttemptStarted(ts=t, world_size=4, num_nodes=1, node="a", attempt=0),
        StepCompleted(ts=t + 1, step=0, start=t, duration=1),
    ]
    if chaos:
        evs.append(ChaosInjected(ts=t + 5, fault="crash", step=1, detail="crash@rank=1,step=1"))
    evs += [
        FailureDetected(ts=t + 5.1, onset=t + 5, failure="crash", evidence="SIGKILL", node="a"),
        DecisionTaken(ts=t + 5.2, action="restart", reason="r"),
        AttemptStarted(ts=t + 6, world_size=4, num_nodes=1, node="a", attempt=1),
        TrainingResumed(ts=t + 9, step=1),
        StepCompleted(ts=t + 10, step=1, start=t + 9, duration=1),
        JobEnded(ts=t + 20, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False),
    ]
    with LedgerWriter(run_dir / "ledger" / "agent-a.ledger") as w:
        w.extend(evs)


def test_chaos_run_keeps_default_rates_and_uses_measured_times(tmp_path):
    base = make_config(gpus=1024, days=3, trials=10)
    _write(tmp_path, chaos=True)
    cfg, notes = _measured(read_merged(tmp_path), base)
    assert [f.per_1000_gpu_days for f in cfg.failures] == [f.per_1000_gpu_days for f in base.failures]
    assert {f.detect_s for f in cfg.failures} != {f.detect_s for f in base.failures}  # measured 0.1 s kept
    assert "injected by chaos" in notes[0]


def test_real_failures_still_set_the_rate(tmp_path):
    base = make_config(gpus=1024, days=3, trials=10)
    _write(tmp_path, chaos=False)
    cfg, notes = _measured(read_merged(tmp_path), base)
    assert [f.per_1000_gpu_days for f in cfg.failures] != [f.per_1000_gpu_days for f in base.failures]
    assert not any("chaos" in n for n in notes)
