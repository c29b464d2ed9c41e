"""Acceptance of the resilient run: chaos with 3 crashes and a hang, exact resume, report reconciliation."""

from __future__ import annotations

import json
import re

import pytest

from stalwart.account.report import build as build_report
from stalwart.events import (
    ChaosInjected,
    CheckpointCommitted,
    CheckpointStaged,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    StackCaptured,
    StepCompleted,
    TrainingResumed,
)
from stalwart.policy.timeouts import p99

from .runner import EXAMPLE, console, same_params, stalwart

pytestmark = pytest.mark.e2e

STEPS, EVERY = 40, 5
CRASHES = {8: 1, 18: 2, 28: 3}  # step -> rank
HANG_STEP, HANG_RANK = 33, 0
# the hang floor: 2 s gave a false hang beside the CPU hog (CI run 18: rank 0 of a cold-started attempt
# silent 2.0 s at step 22 while its peers had finished it, p99 step 0.49 s); the product's own advice for
# a machine with such stalls is a higher --hang-floor (docs/unchanged-scripts.md)
FLOOR = 4.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("chaos")
    # --no-report: printing the report after the verdict is not the job's time, and the reconciliation
    # below compares the ledger's wall time with the process's, within 1%
    common = [
        "run",
        "-q",
        "--no-report",
        "--nproc-per-node",
        "4",
        "--hang-floor",
        str(FLOOR),
        "--max-restarts",
        "5",
        # the whole-group restart (warm, cold) and its rollback to a checkpoint are the subject here; in
        # place is tests/e2e/test_in_place.py, the survivors' left state tests/e2e/test_left_state.py
        "--no-in-place",
        "--no-leave-state",
    ]
    ref = stalwart(
        *common,
        "--no-warm",  # the reference starts cold: warm recoveries must end bit-identical to it
        "--run-dir",
        str(base / "ref"),
        *EXAMPLE,
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--out",
        str(base / "ref.pt"),
    )
    assert ref.code == 0, ref.err + ref.out
    chaos = [f"--chaos=crash@rank={r},step={s}" for s, r in CRASHES.items()]
    chaos.append(f"--chaos=hang@rank={HANG_RANK},step={HANG_STEP}")
    run = stalwart(
        *common,
        "--run-dir",
        str(base / "chaos"),
        *chaos,
        *EXAMPLE,
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--out",
        str(base / "chaos.pt"),
    )
    assert run.code == 0, run.err + run.out
    return base, run


def test_chaos_run_ends_bit_identical_to_uninterrupted(runs):
    base, _ = runs
    from .runner import events

    failures = events(base / "chaos", FailureDetected)
    assert [f.failure for f in failures] == ["crash", "crash", "crash", "hang"]
    assert same_params(base / "ref.pt", base / "chaos.pt")
    starts = [e for e in events(base / "chaos", DecisionTaken) if e.action.startswith("start_")]
    assert [e.action for e in starts] == ["start_warm"] * 5, [e.reason for e in starts]
    assert {e.action for e in events(base / "ref", DecisionTaken)} >= {"start_cold"}


def test_cold_fallback_when_the_warm_path_fails_once_still_ends_bit_identical(runs, tmp_path):
    """The fork server is killed before the second recovery's start: that attempt starts cold with the
    reason in the ledger, a fresh server takes the later recoveries, and the result is unchanged."""
    base, _ = runs
    conf = tmp_path / "warmfail.toml"
    conf.write_text("warm_fail_attempt = 2\n")
    chaos = [f"--chaos=crash@rank={r},step={s}" for s, r in CRASHES.items()]
    chaos.append(f"--chaos=hang@rank={HANG_RANK},step={HANG_STEP}")
    run = stalwart(
        "run", "-q", "--config", str(conf), "--nproc-per-node", "4", "--hang-floor", str(FLOOR), "--no-in-place", "--no-leave-state",
        "--max-restarts", "5", "--run-dir", str(tmp_path / "fallback"), *chaos, *EXAMPLE,
        "--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--out", str(tmp_path / "fallback.pt"),
    )  # fmt: skip
    assert run.code == 0, run.err + run.out
    from .runner import events

    starts = [e for e in events(tmp_path / "fallback", DecisionTaken) if e.action.startswith("start_")]
    assert [(e.attempt, e.action) for e in starts] == [
        (0, "start_warm"), (1, "start_warm"), (2, "start_cold"), (3, "start_warm"), (4, "start_warm")
    ], [e.reason for e in starts]  # fmt: skip
    assert "fork server is gone" in starts[2].reason and "forced by chaos" in starts[2].reason
    assert same_params(base / "ref.pt", tmp_path / "fallback.pt")


def test_hang_detected_within_bound_and_stack_recorded(runs):
    base, _ = runs
    from .runner import events

    evs = events(base / "chaos")
    hang = next(e for e in evs if isinstance(e, FailureDetected) and e.failure == "hang")
    injected = next(e for e in evs if isinstance(e, ChaosInjected) and e.fault == "hang")
    assert hang.rank == HANG_RANK and hang.step == HANG_STEP
    before = [
        e.duration
        for e in evs
        if isinstance(e, StepCompleted) and e.attempt == hang.attempt and e.ts < injected.ts
    ]
    bound = max(3 * p99(before), FLOOR)
    # the monitor's verdict, in its own words: "rank R silent S s at step N (timeout T s, ...)". It
    # declares the hang once the silence reaches the timeout less one monitor tick (0.05 s), so it
    # never lands late by its own schedule; how late the agent's process is woken on a loaded machine is
    # the kernel's (hog CI run 19: 4.012 s after the onset against the 4.0 s bound), so the test checks
    # the verdict's numbers, not the wall clock: the calibrated timeout is the bound, the silence
    # reached it, and the onset (the injection) lies within the silence the monitor saw
    said = re.search(r"silent (\d+\.\d+)s at .*?\(timeout (\d+\.\d+)s", hang.evidence)
    assert said is not None, hang.evidence
    silent, timeout = float(said.group(1)), float(said.group(2))
    assert abs(timeout - bound) <= 0.005, (timeout, bound, hang.evidence)
    # the timeout is reached by the longest silence: the hung rank's, or a waiting rank's that sent its
    # last message before the hung one did (the project's CI run 22: rank 0 silent 3.90 s, a peer longer)
    waited = re.search(r"longest silence (\d+\.\d+)s, rank (\d+)", hang.evidence)
    longest = float(waited.group(1)) if waited else silent
    assert longest >= silent, hang.evidence
    assert longest >= timeout - 0.05 - 0.005, hang.evidence  # not declared early
    latency = hang.ts - injected.ts
    assert 0 < latency <= silent + 0.005, f"hang detected {latency:.3f}s after onset, silence {silent:.3f}s"
    stacks = [
        e for e in evs if isinstance(e, StackCaptured) and e.rank == HANG_RANK and e.attempt == hang.attempt
    ]
    assert stacks and "in _inject" in stacks[0].stack, "the hung rank's Python stack is in the ledger"


def test_report_reconciles_with_wall_time_and_lost_work(runs):
    base, run = runs
    from .runner import events

    rep = build_report(base / "chaos")
    total = sum(rep["buckets_s"].values())
    assert total == pytest.approx(rep["wall_s"], abs=1e-6)
    # never more time than the process tree took (how close it comes depends on the machine's load:
    # interpreter start before the agent's clock, and exit after its verdict; not a test's question)
    assert 0 < total <= run.wall, f"report {total:.2f}s vs measured {run.wall:.2f}s"
    evs = events(base / "chaos")
    # a checkpoint holds the state of the moment its staging ended (the persist follows in the background)
    snapshots = [e for e in evs if isinstance(e, CheckpointStaged)] or [
        e for e in evs if isinstance(e, CheckpointCommitted)
    ]
    crashes = [i for i in rep["interruptions"] if i["failure"] == "crash"]
    assert len(crashes) == 3
    for item in crashes:
        inj = next(
            e for e in evs if isinstance(e, ChaosInjected) and e.fault == "crash" and e.step == item["step"]
        )
        # the last checkpoint that counts is the one the next attempt resumed from (a save whose
        # background persist had not finished when the worker died was never committed)
        resumed = next(e for e in evs if isinstance(e, TrainingResumed) and e.attempt == inj.attempt + 1)
        snap = [c for c in snapshots if c.step == resumed.step and c.attempt == inj.attempt]
        if snap:
            since = snap[0].ts
        else:  # resumed from an older attempt's checkpoint: all of this attempt's work was lost
            since = min(
                e.start
                for e in evs
                if isinstance(e, StepCompleted) and e.attempt == inj.attempt and e.rank == 0
            )
        expected = max(0.0, inj.ts - since)  # a save whose snapshot ended just after the fault lost nothing
        assert item["lost_work_s"] == pytest.approx(expected, rel=0.05), (item, expected)
    # the same ledger through the CLI's --json gives the same numbers as the library
    cli = stalwart("report", "--json", str(base / "chaos"))
    assert cli.code == 0, cli.err
    assert json.loads(cli.out)["buckets_s"] == pytest.approx(rep["buckets_s"])


def test_same_exception_twice_stops_with_user_error(tmp_path):
    from .runner import events

    run = stalwart(
        "run",
        "-q",
        "--nproc-per-node",
        "2",
        "--run-dir",
        str(tmp_path),
        "--chaos",
        "raise@rank=1,step=3",
        *EXAMPLE,
        "--steps",
        "6",
        "--checkpoint-every",
        "0",
    )
    assert run.code == 3, run.out + run.err
    end = events(tmp_path, JobEnded)[-1]
    assert end.outcome == "user_error" and not end.requeue_helps
    assert end.verdict.startswith("user error at step 3: RuntimeError: injected bug at step 3")
    assert "user error at step 3" in console(run.out)
    assert len(events(tmp_path, FailureDetected)) == 2


def test_slowed_rank_is_reported_live_and_in_the_report(tmp_path):
    from stalwart.events import StragglerDetected

    from .runner import events

    run = stalwart(
        "run",
        "-q",
        "--nproc-per-node",
        "4",
        "--run-dir",
        str(tmp_path),
        "--chaos",
        "slow@rank=2,factor=2.5,from=5",
        *EXAMPLE,
        "--steps",
        "40",
        "--checkpoint-every",
        "0",
    )
    assert run.code == 0, run.out + run.err
    found = events(tmp_path, StragglerDetected)
    assert [e.rank for e in found] == [2], found
    assert found[0].score > 1.5
    rep = build_report(tmp_path)
    spans = rep["stragglers"]["spans"]
    assert {sp["rank"] for sp in spans} == {2}
    # not asserted: a straggler_slowdown bucket above 0. That bucket is the excess of a step beyond
    # 1.2 x the run's ideal step (Google's definition: tests/unit/test_goodput.py), and a rank slowed
    # from step 5 to the end slows every later step, so the ideal is the slowed pace itself; the bucket
    # was above 0 only while the first slowed steps ran slower than the later ones, which a CPU hog
    # beside the run erased (CI run 11). The live detector and the report's spans are what name it.
