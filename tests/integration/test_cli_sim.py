"""`stalwart sim` and `stalwart plan` run as real processes: JSON, tables, plots, ledgers, errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.events import (
    AttemptStarted,
    CheckpointCommitted,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from stalwart.ledger import LedgerWriter
from stalwart.sim import simulate
from stalwart.sim.config import make_config

pytestmark = pytest.mark.integration


def cli(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "stalwart.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def test_sim_json_equals_the_library():
    p = cli("sim", "--gpus", "4096", "--days", "5", "--trials", "50", "--seed", "3", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    want = simulate(make_config(gpus=4096, days=5, trials=50, seed=3)).summary()
    assert got == json.loads(json.dumps(want))


def test_sim_tables():
    p = cli("sim", "--gpus", "1024", "--days", "3", "--trials", "20")
    assert p.returncode == 0, p.stderr
    assert "ettr" in p.stdout and "lost_work" in p.stdout and "1,024 GPUs" in p.stdout
    assert "│ cost at 2/GPU-h " in p.stdout  # the cost's unit: the default price of a GPU-hour
    priced = cli("sim", "--gpus", "1024", "--days", "3", "--trials", "5", "--price", "3.5")
    assert "│ cost at 3.5/GPU-h " in priced.stdout, priced.stdout


def test_sim_config_file(tmp_path):
    f = tmp_path / "sim.yaml"
    f.write_text(
        "gpus: 2048\ndays: 2\ntrials: 10\nspare_nodes: 1\n"
        "tiers:\n  - {name: mem, interval_s: 120, stall_s: 1, restore_s: 5, survives_node_loss: false}\n"
        "  - {name: fs, interval_s: 1200, stall_s: 20, restore_s: 120}\n"
    )
    p = cli("sim", "--config", str(f), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["gpus"] == 2048 and d["spare_nodes"] == 1 and len(d["tiers"]) == 2


@pytest.mark.parametrize(
    "args,needle",
    [
        (("sim", "--gpus", "0"), "gpus"),
        (("sim", "--rate-scale", "-2"), "rate-scale"),
        (("sim", "--gpus", "100"), "whole number"),
        (("sim", "--days", "0.001", "--interval", "3600"), "units"),
        (("sim", "--strategy", "pray"), "strategy"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, needle):
    p = cli(*args)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stalwart: error:") and needle in lines[0]
    assert "Traceback" not in p.stderr


def _write_run(run_dir: Path) -> None:
    t = 3_000_000.0
    with LedgerWriter(run_dir / "ledger" / "agent-a.ledger") as w:
        w.extend(
            [
                JobStarted(ts=t, script="x"),
                AttemptStarted(ts=t, world_size=8, num_nodes=1, node="a", attempt=0),
                StepCompleted(ts=t + 10, step=0, start=t, duration=10),
                CheckpointCommitted(ts=t + 20, step=1, path="p", stall_s=2.0),
                FailureDetected(ts=t + 100, onset=t + 95, failure="crash", evidence="Xid 79", node="a"),
                DecisionTaken(ts=t + 101, action="restart", reason="r"),
                AttemptStarted(ts=t + 110, world_size=8, num_nodes=1, node="a", attempt=1),
                TrainingResumed(ts=t + 120, step=1),
                StepCompleted(ts=t + 131, step=1, start=t + 121, duration=10),
                JobEnded(ts=t + 7200, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False),
            ]
        )


def test_plan_from_ledger_with_plots(tmp_path):
    _write_run(tmp_path / "run")
    out = tmp_path / "plots"
    p = cli(
        "plan",
        "--gpus",
        "1024",
        "--days",
        "3",
        "--trials",
        "20",
        "--scale-to",
        "4096",
        "--ledger",
        str(tmp_path / "run"),
        "--plot",
        str(out),
        "--plot-format",
        "svg",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    # one failure is too little to be a rate: the published rates, the run's measured times, and why
    assert d["rates"]["source"] == "published" and "too little to estimate a rate" in d["rates"]["reason"]
    assert any(n.startswith("restart ") and "measured" in n for n in d["notes"])
    assert [s["gpus"] for s in d["scale"]] == [1024, 4096]
    for name in ("ettr_vs_interval.svg", "ettr_vs_gpus.svg"):
        assert (out / name).read_text().lstrip().startswith("<?xml")


def test_plan_tables_and_png(tmp_path):
    p = cli("plan", "--gpus", "1024", "--days", "3", "--trials", "20", "--plot", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "restart strategy" in p.stdout
    assert "cost: of the lost GPU-hours and the spares at 2 a GPU-hour" in p.stdout  # the cost's unit
    assert (tmp_path / "ettr_vs_gpus.png").read_bytes()[:4] == b"\x89PNG"


def test_plan_on_an_empty_ledger_dir_is_an_error(tmp_path):
    (tmp_path / "ledger").mkdir()
    p = cli("plan", "--gpus", "64", "--days", "1", "--trials", "5", "--ledger", str(tmp_path))
    assert p.returncode != 0
    assert p.stderr.startswith("stalwart: error:") and "no ledger files" in p.stderr
