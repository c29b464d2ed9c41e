"""MTBF/MTTR/rates/lemon scoring, including the Llama 3 54-day figures and ledger events."""

import pytest

from stalwart.account import reliability as rel
from stalwart.errors import ConfigError, LedgerError
from stalwart.events import (
    AttemptStarted,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)


def llama3_exposure():
    # 16,384 GPUs = 2,048 nodes of 8, for 54 days of wall clock
    return rel.Exposure(job_hours=54 * 24, gpu_hours=16_384 * 54 * 24, node_hours=2_048 * 54 * 24)


def test_llama3_mtbf_in_both_units():
    exp = llama3_exposure()
    job = rel.mtbf(419, exp, "job_hours")
    gpu = rel.mtbf(419, exp, "gpu_hours")
    # "one failure every ~3 hours" (Llama 3 paper, section 3.3.4): 1296 h / 419 = 3.093 h
    assert job.value == pytest.approx(3.0931, abs=1e-4)
    assert gpu.value == pytest.approx(16_384 * 1296 / 419, rel=1e-12)  # 50,677 GPU-hours
    assert "job-hours" in job.label() and "gpu-hours" in gpu.label()


def test_llama3_rates():
    r = rel.failure_rates(419, llama3_exposure())
    assert r.per_node_day == pytest.approx(419 / (2048 * 54), rel=1e-12)  # 3.79e-3
    assert r.per_1000_gpu_days == pytest.approx(1000 * 419 / (16_384 * 54), rel=1e-12)  # 0.474


def test_no_failures_means_unbounded_mtbf():
    m = rel.mtbf(0, llama3_exposure(), "job_hours")
    assert m.value is None and "no failures" in m.label()


def test_bad_inputs():
    with pytest.raises(ConfigError):
        rel.mtbf(-1, llama3_exposure())
    with pytest.raises(ConfigError):
        rel.mtbf(1, llama3_exposure(), "hours")
    with pytest.raises(ConfigError):
        rel.Exposure(job_hours=-1, gpu_hours=1, node_hours=1)
    with pytest.raises(ConfigError, match="zero"):
        rel.failure_rates(1, rel.Exposure(0, 0, 0))


def test_mttr_split():
    ints = [
        rel.Interruption(onset=0, detected=10, decided=12, recovered=112),
        rel.Interruption(onset=100, detected=130, decided=131, recovered=None),
    ]
    m = rel.mttr(ints)
    assert m.detect_s == 20 and m.decide_s == 1.5 and m.recover_s == 100 and m.total_s == 112
    assert (m.recovered, m.unrecovered) == (1, 1)


def test_lemon_needs_exposure_for_every_failing_node():
    with pytest.raises(ConfigError, match="without exposure"):
        rel.lemon_scores({"x": 1}, {"y": 1.0})


def _run_events():
    t = 1_000_000.0
    return [
        JobStarted(ts=t, script="train.py", nproc_per_node=8),
        AttemptStarted(ts=t + 1, world_size=16, num_nodes=2, node="a", attempt=0),
        AttemptStarted(ts=t + 1.2, world_size=16, num_nodes=2, node="b", attempt=0),
        StepCompleted(ts=t + 100, step=1, start=t + 90, duration=10),
        FailureDetected(
            ts=t + 3600, onset=t + 3590, failure="peer_lost", evidence="peer gone", node="a", rank=0
        ),
        FailureDetected(
            ts=t + 3605,
            onset=t + 3580,
            failure="crash",
            evidence="Xid 79 fallen off the bus",
            node="b",
            rank=9,
        ),
        DecisionTaken(ts=t + 3607, action="restart", reason="infra fault"),
        AttemptStarted(ts=t + 3700, world_size=8, num_nodes=1, node="a", attempt=1),
        TrainingResumed(ts=t + 3750, step=300),
        StepCompleted(ts=t + 3760, step=300, start=t + 3750, duration=10),
        JobEnded(ts=t + 7200, verdict="done", outcome="succeeded", exit_code=0, requeue_helps=False),
    ]


def test_interruptions_from_events():
    run = rel.interruptions_from_events(_run_events())
    assert len(run.interruptions) == 1
    i = run.interruptions[0]
    assert i.component == "gpu" and i.node == "b" and i.gpus == 16
    assert i.detect_s == 20 and i.decide_s == 7 and i.recover_s == pytest.approx(3760 - 3607)
    assert run.exposure.job_hours == pytest.approx(2.0)
    # attempt 0: 16 GPUs from t+1 to t+3700; attempt 1: 8 GPUs until t+7200
    assert run.exposure.gpu_hours == pytest.approx((16 * 3699 + 8 * 3500) / 3600)
    assert run.node_days["a"] == pytest.approx(7199 / 86400)
    assert run.node_days["b"] == pytest.approx(3699 / 86400)


def test_empty_ledger_is_an_error():
    with pytest.raises(LedgerError, match="no events"):
        rel.interruptions_from_events([])
