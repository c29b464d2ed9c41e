"""The chaos plan is the ground truth of the detector table: a slowed rank, found by the straggler
detector, is a caught fault (the demo's table said "confirmed 0, faults 0")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stalwart.diagnose.precision import detector_stats
from stalwart.events import ChaosInjected

from .runner import EXAMPLE, events, stalwart

pytestmark = pytest.mark.e2e


def test_a_slowed_rank_is_a_caught_fault_in_the_detector_table(tmp_path: Path):
    rd = tmp_path / "run"
    run = stalwart(
        "run", "-q", "--no-health-gate", "--nproc-per-node", "2", "--run-dir", str(rd),
        "--chaos", "slow@rank=1,factor=3,from=8,to=35",
        *EXAMPLE, "--steps", "45", "--checkpoint-every", "20",
        timeout=400,
    )  # fmt: skip
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    evs = events(rd)
    slow = [e for e in evs if isinstance(e, ChaosInjected)]
    assert [(e.fault, e.rank, e.step, e.until_step) for e in slow] == [("slow", 1, 8, 35)]
    s = {d.detector: d for d in detector_stats(evs)}["straggler"]
    assert s.faults == 1 and s.caught == 1 and s.confirmed >= 1, s
    report = stalwart("report", str(rd), "--json")
    assert report.code == 0, report.err[-2000:]
    table = {d["detector"]: d for d in json.loads(report.out)["detectors"]}
    assert table["straggler"]["caught"] == 1 and table["straggler"]["recall"] == 1.0
