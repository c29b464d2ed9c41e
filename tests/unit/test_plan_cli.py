"""``stalwart plan --ledger``: a sensible answer with its uncertainty, and bad input as one line."""

from __future__ import annotations

import json

import pytest

from stalwart import cli
from stalwart.events import (
    AttemptStarted,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
)
from stalwart.ledger import LedgerWriter
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.run_ledger import write


def _simulated_run(tmp_path, per_1000=3000.0, days=0.1, seed=3):
    cfg = SimConfig(
        gpus=8,
        days=days,
        trials=2,
        seed=seed,
        failures=[FailureClass(name="x", per_1000_gpu_days=per_1000, node_loss=False, detect_s=5.0)],
        planned_per_1000_gpu_days=0.0,
        decide_s=1.0,
        job_restart_s=20.0,
        tiers=[CheckpointTier(name="fs", interval_s=60.0, stall_s=2.0, restore_s=3.0)],
    )
    r = simulate(cfg, trace=True)
    write(r, tmp_path, step_s=2.0)
    return r


def _one_error_line(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stalwart: error:"), err
    return err[0]


def test_plan_from_a_short_run_gives_rates_with_bounds_and_the_run_replayed(tmp_path, capsys):
    r = _simulated_run(tmp_path)
    assert r.interruptions[0] >= 3
    cli.main(["plan", "--ledger", str(tmp_path), "--gpus", "64", "--days", "2", "--trials", "20", "--json"])
    m = json.loads(capsys.readouterr().out)["measured"]
    low, high = m["per_node_hour_95"]
    assert low < m["per_node_hour"] < high
    assert m["failures"] == int(r.interruptions[0])
    assert abs(m["goodput_predicted"] - m["goodput_measured"]) < 0.1


def test_plan_tables_fit_80_columns(tmp_path, capsys, monkeypatch):
    _simulated_run(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    cli.main(["plan", "--ledger", str(tmp_path), "--gpus", "64", "--days", "2", "--trials", "20"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "e-0" not in out and "0.0348" not in out  # durations are formatted, not raw floats


def _plan_json(capsys, argv) -> dict:
    cli.main([*argv, "--json"])  # returns: exit 0
    return json.loads(capsys.readouterr().out)


def test_a_finished_run_without_failures_plans_with_published_rates(tmp_path, capsys):
    t = 1_700_000_000.0
    with LedgerWriter(tmp_path / "ledger" / "a.ledger") as w:
        w.extend(
            [
                JobStarted(ts=t, script="x"),
                AttemptStarted(ts=t, world_size=8, num_nodes=1, node="a", attempt=0),
                StepCompleted(ts=t + 10, step=0, start=t, duration=10, rank=0),
                JobEnded(ts=t + 60, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False),
            ]
        )
    d = _plan_json(
        capsys, ["plan", "--ledger", str(tmp_path), "--gpus", "64", "--days", "1", "--trials", "5"]
    )
    assert d["rates"]["source"] == "published" and "no infrastructure failure" in d["rates"]["reason"]
    assert d["measured"] is None and any("nothing to replay" in n for n in d["notes"])


def test_a_hand_killed_run_plans_and_says_which_rates_it_used_and_why(tmp_path, capsys):
    t = 1_700_000_000.0
    with LedgerWriter(tmp_path / "ledger" / "a.ledger") as w:
        w.extend(
            [
                JobStarted(ts=t, script="x"),
                AttemptStarted(ts=t, world_size=2, num_nodes=1, node="a", attempt=0),
                StepCompleted(ts=t + 1, step=0, start=t, duration=1, rank=0),
                FailureDetected(ts=t + 5.1, onset=t + 5, failure="crash", evidence="SIGKILL", node="a"),
                DecisionTaken(ts=t + 5.2, action="restart", reason="r"),
                AttemptStarted(ts=t + 5.5, world_size=2, num_nodes=1, node="a", attempt=1),
                StepCompleted(ts=t + 7, step=1, start=t + 6, duration=1, rank=0),
                JobEnded(ts=t + 9, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False),
            ]
        )
    argv = ["plan", "--ledger", str(tmp_path), "--gpus", "64", "--days", "1", "--trials", "5"]
    d = _plan_json(capsys, argv)
    assert d["rates"]["source"] == "published" and "too little to estimate a rate" in d["rates"]["reason"]
    marked = _plan_json(capsys, [*argv, "--faults-are-tests"])
    assert "marked as tests" in marked["rates"]["reason"]
    cli.main(argv)  # and the tables say it
    assert "too little to estimate a rate" in " ".join(capsys.readouterr().out.split())


def test_a_measured_rate_that_leaves_no_time_to_run_falls_back_to_published_rates(tmp_path, capsys):
    r = _simulated_run(tmp_path, per_1000=3000.0, days=0.5)
    assert r.interruptions[0] >= 5  # enough failures to be a measured rate
    # the measured rate is a real one (no chaos): at 65,536 GPUs a failure would come every half second
    argv = ["plan", "--ledger", str(tmp_path), "--gpus", "65536", "--days", "1", "--trials", "2"]
    d = _plan_json(capsys, argv)
    assert d["rates"]["source"] == "published"
    assert (
        "never make progress" in d["rates"]["reason"]
        and "published failure rates instead" in d["rates"]["reason"]
    )


def test_mismatched_units_are_one_line(tmp_path, capsys):
    line = _one_error_line(
        capsys, ["plan", "--interval", "30", "--stall", "30000", "--gpus", "64", "--days", "1"]
    )
    assert "units" in line


def test_a_size_asked_for_that_is_not_whole_groups_is_said_to_be_rounded(capsys):
    """--scale-to 100000 for the 405B default (128-GPU model-parallel groups) is planned at 99,968
    GPUs, and the plan says so and why instead of a row that silently reads 99,968."""
    cli.main(
        ["plan", "--gpus", "16384", "--scale-to", "100000", "--scale-to", "4", "--trials", "5", "--json"]
    )
    d = json.loads(capsys.readouterr().out)
    assert [p["gpus"] for p in d["scale"]] == [16384, 99968]
    assert (
        "--scale-to 100,000 is predicted at 99,968 GPUs: rounded down to whole model-parallel groups of "
        "128 GPUs (TP 8 x PP 16, as Llama 3 405B trained) on whole nodes of 8 GPUs" in d["notes"]
    )
    assert "--scale-to 4 is not predicted: fewer GPUs than one node (8)" in d["notes"]
    cli.main(["plan", "--gpus", "16384", "--scale-to", "32768", "--trials", "5", "--json"])
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "--scale-to" in n]  # whole already
