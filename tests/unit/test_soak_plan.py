"""The soak's pure parts: plans it draws and how it sums up runs."""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from stalwart.chaos.soak import (
    BETWEEN,
    KINDS,
    REQUEUERS,
    PlannedFault,
    RunResult,
    SoakConfig,
    SoakFault,
    Venue,
    draw_plan,
    summarize,
)
from stalwart.chaos.soak_files import damage_between
from stalwart.chaos.soak_verdict import JobSeen, check_job


def test_plans_are_valid_for_the_job():
    cfg = SoakConfig(workdir=Path("/nonexistent"), steps=24, every=4, nproc=3)
    rng = random.Random(7)
    seen = Counter()
    for _ in range(500):
        plan = draw_plan(rng, cfg)
        kinds = [f.kind for f in plan]
        seen.update(kinds)
        assert len(kinds) == len(set(kinds)), "one fault of each kind per run"
        assert sum(k.startswith("full-disk") for k in kinds) <= 1
        if any(k in BETWEEN for k in kinds):
            assert any(k in REQUEUERS for k in kinds), "damage between jobs needs a job that ends early"
        assert all(0 <= f.rank < cfg.nproc and 0 < f.step < cfg.steps for f in plan)
        assert [f.step for f in plan] == sorted(f.step for f in plan)
    assert set(seen) == set(KINDS), "every kind is drawn"


def test_flags_match_the_chaos_syntax():
    assert PlannedFault("crash", 6, 1).flag() == "crash@rank=1,step=6"
    assert PlannedFault("kill-agent", 9).flag() == "kill-agent@node=0,step=9"
    assert PlannedFault("corrupt-checkpoint", 12).flag() == "corrupt-checkpoint@step=12"
    with pytest.raises(ValueError, match="done by the harness"):
        PlannedFault("sigkill-agent", 9).flag()


def test_every_kind_has_one_venue_and_the_inside_ones_are_chaos_faults():
    from stalwart.chaos.plan import FaultKind

    assert {k.venue for k in SoakFault} == set(Venue)
    inside = [k for k in KINDS if k.venue is Venue.INSIDE]
    assert inside and all(FaultKind(k.value) for k in inside)
    assert [str(k) for k in KINDS[:3]] == [
        "crash",
        "exit",
        "hang",
    ]  # the draw's order: plans stay reproducible


def test_summary_counts_problems_and_identical_ends():
    a = RunResult(0, (), fired=Counter({"crash": 2}), exit_codes=[0], bit_identical=True)
    b = RunResult(
        1,
        (),
        fired=Counter({"crash": 1, "sigkill-agent": 1}),
        exit_codes=[76, 0],
        bit_identical=False,
        false_verdicts=["job 0: exit 76 but nothing saved"],
    )
    c = RunResult(2, (), exit_codes=[75], tool_hangs=1, wrong_resumes=["x"], lost_versions=["y", "z"])
    s = summarize([a, b, c])
    assert s.faults == {"crash": 3, "sigkill-agent": 1} and s.total_faults == 4
    assert (s.runs, s.finished, s.bit_identical, s.not_identical) == (3, 2, 1, 1)
    assert (s.false_verdicts, s.wrong_resumes, s.versions_lost, s.tool_hangs) == (1, 1, 2, 1)
    assert not s.clean
    assert summarize([a]).clean


def test_a_damaged_side_ledger_counts_as_fired_and_names_no_checkpoint(tmp_path):
    rng = random.Random(0)
    assert damage_between("corrupt-ledger", tmp_path, rng) == (False, None)  # nothing to damage
    (tmp_path / "ledger").mkdir()
    side = tmp_path / "ledger" / "worker-n0-a0-r0-p1.ledger"
    with sqlite3.connect(side) as db:
        db.execute("create table t (x)")
    assert damage_between("corrupt-ledger", tmp_path, rng) == (True, None)
    with pytest.raises(sqlite3.DatabaseError), sqlite3.connect(side) as db:
        db.execute("select * from t")


def _ckpt(root: Path, step: int) -> None:
    (root / "checkpoints" / f"step-{step:09d}").mkdir(parents=True)


def test_a_version_deleted_for_a_damaged_newer_one_is_not_lost_but_one_deleted_early_is(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "ledger").mkdir(parents=True)
    for step in (16, 20, 24):  # retention kept these three; 16 was damaged by the run's own chaos
        _ckpt(run_dir, step)
    before = {4: Path("4"), 12: Path("12"), 16: Path("16")}
    after = {20: Path("20"), 24: Path("24")}  # 16 no longer verifies
    res = RunResult(0, ())
    check_job(run_dir, JobSeen(1, 0.0, 1, before, after), keep=3, steps=24, every=4, damaged={16}, res=res)
    assert res.lost_versions == []
    res = RunResult(0, ())  # the same end with nothing damaged on purpose: 16 went bad, 4 and 12 early
    check_job(run_dir, JobSeen(1, 0.0, 1, before, after), keep=3, steps=24, every=4, damaged=set(), res=res)
    assert sorted(int(v.split()[3]) for v in res.lost_versions) == [4, 12, 16]


def test_a_final_version_damaged_by_the_runs_own_chaos_is_no_false_success(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "ledger").mkdir(parents=True)
    after = {16: Path("16"), 20: Path("20")}  # 24 committed, then the plan's corrupt-checkpoint hit it
    res = RunResult(0, ())
    check_job(run_dir, JobSeen(0, 0.0, 0, {}, after), keep=3, steps=24, every=4, damaged={24}, res=res)
    assert res.false_verdicts == []
    res = RunResult(0, ())
    check_job(run_dir, JobSeen(0, 0.0, 0, {}, after), keep=3, steps=24, every=4, damaged=set(), res=res)
    assert res.false_verdicts and "final step 24" in res.false_verdicts[0]
