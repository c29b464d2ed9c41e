"""A simulated run written as a ledger reads back through the report with the simulator's buckets."""

import io
import json

import numpy as np
import pytest
from rich.console import Console

from stalwart import cli
from stalwart.account.goodput import BUCKETS as REPORT_BUCKETS
from stalwart.account.goodput import compute
from stalwart.account.report import build, render
from stalwart.errors import ConfigError
from stalwart.events import FailureDetected, StepCompleted, TrainingResumed
from stalwart.ledger import read_merged
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.buckets import SIM_BUCKETS, to_report
from stalwart.sim.run_ledger import events_of, write
from widths import unwrap


def _cfg(**kw):
    values = dict(
        gpus=16,
        days=0.25,  # 6 hours
        trials=4,
        seed=11,
        failures=[
            FailureClass(name="gpu", per_1000_gpu_days=2000.0, node_loss=True, detect_s=40.0),
            FailureClass(name="bug", per_1000_gpu_days=2000.0, node_loss=False, detect_s=15.0),
        ],
        planned_per_1000_gpu_days=0.0,
        decide_s=2.0,
        job_restart_s=90.0,
        tiers=[CheckpointTier(name="fs", interval_s=300.0, stall_s=12.0, restore_s=25.0)],
    )
    values.update(kw)
    return SimConfig(**values)


def test_sim_buckets_are_the_report_buckets_plus_what_only_a_simulation_sees():
    assert set(REPORT_BUCKETS) <= set(SIM_BUCKETS)
    folded = to_report({"wait_nodes": 5.0, "restart": 1.0, "shrunk": 2.0, "productive": 3.0})
    assert folded["restart"] == 6.0 and folded["productive"] == 5.0
    assert set(folded) == set(REPORT_BUCKETS)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_report_of_a_simulated_ledger_equals_the_simulation(tmp_path, seed):
    r = simulate(_cfg(seed=seed), trace=True)
    assert sum(1 for c in r.trace if c["failed"]) >= 5  # enough faults to exercise every bucket
    write(r, tmp_path, step_s=5.0)
    report = compute(read_merged(tmp_path))
    sim = to_report({b: float(v[0]) for b, v in r.buckets.items()})
    assert report.wall_s == pytest.approx(r.config.horizon_s, abs=1e-3)
    for name in REPORT_BUCKETS:
        assert report.buckets[name] == pytest.approx(sim[name], abs=1e-3), name
    assert len(report.interruptions) == int(r.interruptions[0])


def test_waiting_for_a_repaired_node_is_restart_time_in_the_report(tmp_path):
    r = simulate(_cfg(spare_nodes=0, repair_hours=0.2, seed=5), trace=True)
    assert r.buckets["wait_nodes"][0] > 0
    write(r, tmp_path, step_s=5.0)
    report = compute(read_merged(tmp_path))
    sim = to_report({b: float(v[0]) for b, v in r.buckets.items()})
    np.testing.assert_allclose(
        [report.buckets[b] for b in REPORT_BUCKETS], [sim[b] for b in REPORT_BUCKETS], atol=1e-3
    )


def test_ledger_needs_a_step_that_divides_the_interval():
    r = simulate(_cfg(), trace=True)
    with pytest.raises(ConfigError, match="divide"):
        events_of(r, step_s=7.0)


def test_failures_only_while_training_also_read_back_exactly(tmp_path):
    r = simulate(_cfg(fail_in_recovery=False, seed=21), trace=True)
    assert all(c["recovered"] for c in r.trace[:-1])  # no recovery is ever cut short
    write(r, tmp_path, step_s=5.0)
    report = compute(read_merged(tmp_path))
    sim = to_report({b: float(v[0]) for b, v in r.buckets.items()})
    for name in REPORT_BUCKETS:
        assert report.buckets[name] == pytest.approx(sim[name], abs=1e-3), name


def test_a_simulated_failure_names_the_step_it_struck(tmp_path):
    """Each failure carries the step it cut short (the last step before it, ending at its onset), or
    the next step to run when it struck outside a step (a save, a recovery); never -1, "unknown"."""
    r = simulate(_cfg(seed=12), trace=True)
    evs = events_of(r, step_s=5.0)
    failures = [e for e in evs if isinstance(e, FailureDetected)]
    assert len(failures) >= 5
    for f in failures:
        done = [e for e in evs if isinstance(e, StepCompleted) and e.ts <= f.onset + 1e-9]
        resumed = [e.step for e in evs if isinstance(e, TrainingResumed) and e.ts <= f.onset]
        cut = done and abs(done[-1].ts - f.onset) < 1e-6 and done[-1].attempt == f.attempt
        assert f.step == (done[-1].step if cut else max([*resumed, *(d.step + 1 for d in done), 0])), f
    write(r, tmp_path, step_s=5.0)
    out = io.StringIO()
    render(build(tmp_path), Console(file=out, width=100, highlight=False))
    table = out.getvalue().split("Interruptions", 1)[1].split("Recoveries", 1)[0]
    assert "│ crash " in table and " -1 " not in table


def test_sim_says_what_it_wrote_and_where(tmp_path, capsys):
    argv = ["sim", "--gpus", "16", "--days", "0.25", "--trials", "2", "--rate-scale", "500", "--step", "10"]
    cli.main([*argv, "--write-ledger", str(tmp_path / "a")])
    said = unwrap(capsys.readouterr().out)  # a long path is cut at 80 columns
    assert (
        f"as a run's ledger: {tmp_path / 'a' / 'ledger' / 'sim.ledger'}; read it with: stalwart report"
        in said
    )
    cli.main([*argv, "--write-ledger", str(tmp_path / "b"), "--json"])
    got = capsys.readouterr()
    assert json.loads(got.out)["trials"] == 2  # stdout stays one JSON document; the note is on stderr
    assert str(tmp_path / "b" / "ledger" / "sim.ledger") in unwrap(got.err)
