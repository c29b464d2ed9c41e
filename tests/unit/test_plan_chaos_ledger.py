"""``stalwart plan --ledger``: injected faults, faults marked as tests and too few failures are not a
failure rate (published rates, measured times); enough real failures are."""

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
from stalwart.sim.evidence import RateSource


def _write(run_dir, *, chaos: bool, failures: int = 1) -> None:
    """A run of 4 ranks with ``failures`` crash-and-restart cycles of 10 s each."""
    t = 3_000_000.0
    evs = [
        JobStarted(ts=t, script="x"),
        AttemptStarted(ts=t, world_size=4, num_nodes=1, node="a", attempt=0),
        StepCompleted(ts=t + 1, step=0, start=t, duration=1),
    ]
    for n in range(failures):
        c = t + 10 * n
        if chaos:
            evs.append(
                ChaosInjected(ts=c + 5, fault="crash", step=n + 1, detail=f"crash@rank=1,step={n + 1}")
            )
        evs += [
            FailureDetected(ts=c + 5.1, onset=c + 5, failure="crash", evidence="SIGKILL", node="a"),
            DecisionTaken(ts=c + 5.2, action="restart", reason="r"),
            AttemptStarted(ts=c + 6, world_size=4, num_nodes=1, node="a", attempt=n + 1),
            TrainingResumed(ts=c + 9, step=n + 1),
            StepCompleted(ts=c + 10, step=n + 1, start=c + 9, duration=1),
        ]
    evs.append(
        JobEnded(
            ts=t + 10 * failures + 10, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False
        )
    )
    with LedgerWriter(run_dir / "ledger" / "agent-a.ledger") as w:
        w.extend(evs)


def _rates(cfg) -> list[float]:
    return [f.per_1000_gpu_days for f in cfg.failures]


def test_chaos_run_keeps_default_rates_and_uses_measured_times(tmp_path):
    base = make_config(gpus=1024, days=3, trials=10)
    _write(tmp_path, chaos=True, failures=8)
    cfg, notes, rates = _measured(read_merged(tmp_path), base)
    assert _rates(cfg) == _rates(base) and rates.source is RateSource.PUBLISHED
    assert {f.detect_s for f in cfg.failures} != {f.detect_s for f in base.failures}  # measured 0.1 s kept
    assert "injected by chaos" in notes[0] and "injected by chaos" in rates.reason


def test_enough_real_failures_set_the_rate(tmp_path):
    base = make_config(gpus=1024, days=3, trials=10)
    _write(tmp_path, chaos=False, failures=8)
    cfg, notes, rates = _measured(read_merged(tmp_path), base)
    assert _rates(cfg) != _rates(base) and rates.source is RateSource.MEASURED
    assert not any("chaos" in n for n in notes)
    assert any(n.startswith("failure rate") for n in notes)


def test_one_kill_by_hand_is_too_little_to_be_a_rate_and_says_so(tmp_path):
    base = make_config(gpus=1024, days=3, trials=10)
    _write(tmp_path, chaos=False, failures=1)
    cfg, notes, rates = _measured(read_merged(tmp_path), base)
    assert _rates(cfg) == _rates(base) and rates.source is RateSource.PUBLISHED
    assert "too little to estimate a rate" in rates.reason and "--faults-are-tests" in rates.reason
    assert {f.detect_s for f in cfg.failures} != {f.detect_s for f in base.failures}  # times still measured


def test_failures_marked_as_tests_keep_the_published_rates_however_many(tmp_path):
    base = make_config(gpus=1024, days=3, trials=10)
    _write(tmp_path, chaos=False, failures=8)
    cfg, _notes, rates = _measured(read_merged(tmp_path), base, faults_are_tests=True)
    assert _rates(cfg) == _rates(base) and rates.source is RateSource.PUBLISHED
    assert "marked as tests" in rates.reason
