"""--checkpoint-every auto on a real run: faults every few seconds shorten the interval, and no
decided interval is shorter than the persist it has to wait for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stalwart.checkpoint.advisor import recommend_from_ledger
from stalwart.events.checkpoint import CheckpointIntervalAdvised

from .runner import EXAMPLE, events, stalwart

pytestmark = pytest.mark.e2e


def _run(run_dir: Path, *chaos: str) -> list:
    res = stalwart(
        "run", "-q", "--no-health-gate", "--nproc-per-node", "2", "--run-dir", str(run_dir),
        "--max-restarts", "5", *chaos, *EXAMPLE, "--steps", "50", "--checkpoint-every", "auto",
        timeout=500,
    )  # fmt: skip
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    return events(run_dir)


def test_faults_every_few_seconds_choose_a_shorter_interval(tmp_path: Path):
    calm = _run(tmp_path / "calm")
    stormy = _run(tmp_path / "stormy", "--chaos", "crash@rank=1,step=14", "--chaos", "crash@rank=0,step=24")
    first = [e for e in calm if isinstance(e, CheckpointIntervalAdvised)]
    last = [e for e in stormy if isinstance(e, CheckpointIntervalAdvised)]
    assert first and last, "every run records its decisions"
    assert "default" in first[-1].reason and "this run: 2 failure" in last[-1].reason, last[-1].reason
    assert last[-1].interval_steps < first[-1].interval_steps
    for d in first + last:  # on the persist the run measured: the next save never waits for it
        floor = float(re.search(r"needs >= ([\d.]+)s", d.reason).group(1))
        assert round(d.interval_s, 2) >= floor, d.reason  # the reason prints both to 0.01 s
    # `plan --ledger` decides with the same function on the recorded run
    assert recommend_from_ledger(stormy) is not None
    shown = stalwart("report", str(tmp_path / "stormy"))
    assert "checkpoint interval (auto), steps over time:" in shown.out, shown.out[-3000:]
