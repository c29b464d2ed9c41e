"""Acceptance of the planner on a measured run: a chaos run with dozens of faults of several kinds,
injected at steps drawn from a Poisson process; the simulator, given the rates and times fitted from
the run's own ledger, predicts its goodput within 3 percentage points: a run whose failures are
recovered by whole-group restarts (rolled back to the checkpoint), and one whose failures are mostly
recovered in place (no rollback), each replayed by its own mechanisms."""

from __future__ import annotations

import json
import random

import pytest
from tests.e2e.runner import EXAMPLE, stalwart

pytestmark = pytest.mark.e2e

STEPS, EVERY, MEAN_GAP = 240, 5, 10  # a fault every 10 steps on average: ~24 faults
KINDS = ("crash", "exit", "crash", "hang")  # hang: detected by the calibrated hang timeout


def _faults(seed: int = 7) -> list[str]:
    rng, into = random.Random(seed), random.Random(seed + 1)
    out, step = [], 0
    while True:
        step += max(2, round(rng.expovariate(1.0 / MEAN_GAP)))
        if step >= STEPS - 2:
            return out
        kind = rng.choice(KINDS)
        # a kill strikes anywhere in its step, as the replay's failures do (at a step boundary, each
        # would lose half a step less than a failure at a uniform time: ~4 points of this run)
        at = f",at={into.random():.3f}" if kind in ("crash", "exit") else ""
        out.append(f"--chaos={kind}@rank={rng.randrange(2)},step={step}{at}")


def _chaos(tmp_path_factory, name: str, *flags: str):
    run_dir = tmp_path_factory.mktemp(name) / "run"
    faults = _faults()
    assert len(faults) >= 18
    r = stalwart(
        "run",
        "-q",
        "--no-report",
        "--nproc-per-node",
        "2",
        "--hang-floor",
        "2",
        "--max-restarts",
        str(len(faults) + 5),
        *flags,
        "--run-dir",
        str(run_dir),
        *faults,
        *EXAMPLE,
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
    )
    assert r.code == 0, r.err[-3000:] + r.out[-3000:]
    return run_dir, len(faults)


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory):
    """Every failure recovered by a whole-group restart, rolled back to the checkpoint (the simulator's
    warm option does not model the survivors' left state)."""
    return _chaos(tmp_path_factory, "predict", "--no-in-place", "--no-leave-state")


@pytest.fixture(scope="module")
def in_place_run(tmp_path_factory):
    """Failures recovered in place where the agent can (no rollback), by a restart where it cannot.
    The run has a fault every 10 steps, hangs included (the stacks pin them, so they are replaced in
    place too): with the default cap of 10 in-place recoveries per attempt the cap, not the faults,
    decided every tenth recovery, and a re-formation cuts short the checkpoint persist in flight, so
    those restarts rolled back past several uncommitted saves (19 steps where the simulator, which
    models neither, books half an interval). The cap has its own test (test_inplace_policy.py); here it is
    raised so that the replay is checked on the mechanism it models."""
    return _chaos(tmp_path_factory, "predict_in_place", "--in-place-max", "100")


def _replayed(run_dir) -> dict:
    p = stalwart("plan", "--ledger", str(run_dir), "--gpus", "64", "--days", "2", "--trials", "100", "--json")
    assert p.code == 0, p.err
    return json.loads(p.out)["measured"]


@pytest.fixture(scope="module")
def in_place_replay(in_place_run):
    run_dir, n = in_place_run
    return _replayed(run_dir), n


def test_plan_predicts_the_measured_goodput_within_3_points(chaos_run):
    run_dir, n = chaos_run
    m = _replayed(run_dir)
    assert m["failures"] >= n - 2  # every injected fault was detected (a hang may mask a close crash)
    assert m["injected"] >= n - 2
    assert abs(m["goodput_predicted"] - m["goodput_measured"]) <= 0.03, m
    wall = m["wall_s"]

    def share(which: str, *buckets: str) -> float:
        return sum(m[f"buckets_{which}_s"][b] for b in buckets) / wall

    # bucket by bucket within 5 points; the measured recovery includes the restore, so the simulator
    # books both as restart (restore is split out only when measured separately)
    for buckets in (("productive",), ("lost_work",), ("detection",), ("restart", "checkpoint_restore")):
        assert abs(share("measured", *buckets) - share("predicted", *buckets)) <= 0.05, (buckets, m)


def _share(m: dict, which: str, *buckets: str) -> float:
    return sum(m[f"buckets_{which}_s"][b] for b in buckets) / m["wall_s"]


def test_the_fit_tells_in_place_recoveries_apart_and_replays_them_without_rollback(in_place_replay):
    m, n = in_place_replay
    assert m["failures"] >= n - 2
    placed = [c for c in m["classes"] if c["in_place"]]
    assert placed, m["classes"]  # the fit tells the failures recovered in place apart
    assert all(c["name"].endswith("(in place)") and c["restart_s"] is not None for c in placed)
    # replayed as a rollback per failure, the lost work came out at ~20% of the wall time against a
    # measured ~9%; by its mechanism, bucket by bucket within 5 points as for the restarted run
    for buckets in (("lost_work",), ("detection",), ("restart", "checkpoint_restore")):
        assert abs(_share(m, "measured", *buckets) - _share(m, "predicted", *buckets)) <= 0.05, (buckets, m)


def test_plan_replays_in_place_recoveries_within_3_points(in_place_replay):
    m, _ = in_place_replay
    assert abs(m["goodput_predicted"] - m["goodput_measured"]) <= 0.03, m
