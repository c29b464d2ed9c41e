"""Fitting a measured run: per-node-hour rates with exact Poisson bounds, and bad ledgers refused."""

import pytest

from stalwart.errors import ConfigError, LedgerError
from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate
from stalwart.sim.config import make_config
from stalwart.sim.fit import check_feasible, fit_run, poisson_interval, run_config
from stalwart.sim.run_ledger import events_of


def _cfg(**kw):
    values = dict(
        gpus=16,
        days=0.25,
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


@pytest.mark.parametrize(
    "count,low,high",
    # Garwood 95% bounds for a Poisson count (published tables, e.g. Ulm 1990)
    [(0, 0.0, 3.689), (1, 0.0253, 5.572), (2, 0.2422, 7.225), (10, 4.795, 18.39), (30, 20.24, 42.83)],
)
def test_poisson_interval_matches_the_exact_tables(count, low, high):
    lo, hi = poisson_interval(count, 1.0)
    assert lo == pytest.approx(low, abs=2e-3) and hi == pytest.approx(high, rel=2e-3)
    lo2, hi2 = poisson_interval(count, 4.0)  # per unit of exposure
    assert (lo2, hi2) == pytest.approx((lo / 4, hi / 4))


def test_fit_of_a_simulated_run_recovers_its_rate_within_the_bounds():
    cfg = _cfg(days=2.0, seed=2)
    r = simulate(cfg, trace=True)
    fit = fit_run(events_of(r, step_s=5.0))
    true_per_node_hour = sum(f.per_1000_gpu_days for f in cfg.failures) / 1000 * cfg.gpus_per_node / 24
    rate, low, high = fit.per_node_hour
    assert fit.failures == int(r.interruptions[0]) >= 20
    # exposure is the whole wall time (every second is at risk, as in the simulator)
    assert fit.node_hours == pytest.approx(cfg.nodes * cfg.horizon_s / 3600)
    assert low < true_per_node_hour < high
    assert fit.stall_s == pytest.approx(12.0) and fit.interval_s == pytest.approx(300.0)
    replay = make_config(**run_config(fit, {}, trials=50))
    assert replay.gpus == cfg.gpus and replay.days == pytest.approx(cfg.days)


def test_a_run_without_steps_or_attempts_is_refused():
    with pytest.raises(LedgerError):
        fit_run([])


def test_millisecond_timestamps_are_a_units_error():
    r = simulate(_cfg(), trace=True)
    evs = [type(e)(**{**e.__dict__, "ts": e.ts * 1000.0}) for e in events_of(r, step_s=5.0)]
    with pytest.raises(LedgerError, match="milliseconds"):
        fit_run(evs)


def test_rates_that_leave_no_time_to_run_are_refused():
    fine = make_config(gpus=1024, days=1, trials=5)
    check_feasible(fine, "default")
    mad = make_config(
        gpus=16384,
        days=1,
        trials=5,
        failures=[{"name": "x", "per_1000_gpu_days": 2e5, "detect_s": 60}],
    )
    with pytest.raises(ConfigError, match="never make progress"):
        check_feasible(mad, "measured")


def test_stall_longer_than_the_interval_is_a_units_error():
    with pytest.raises(ConfigError, match="units"):
        make_config(tiers=[{"name": "a", "interval_s": 30, "stall_s": 30000}])  # ms for s


def _recovering_ledger(paths, step_s=1.0):
    """A hand-written two-rank run: each entry of ``paths`` is a failure followed by a restart that
    took (path, re-form, load, first step) seconds (path "warm+peer": warm, state loaded from a peer);
    every attempt trains five steps of ``step_s``."""
    from stalwart.events import (
        AttemptStarted,
        CheckpointLoaded,
        DecisionTaken,
        FailureDetected,
        JobEnded,
        JobStarted,
        StepCompleted,
        TrainingResumed,
        WorkersStarted,
        WorkersStopped,
    )

    t, evs, step = 1_700_000_000.0, [], 0

    def ctx(a):
        return dict(run_id="r", node="n0", attempt=a)

    def train(a, t, n=5):
        nonlocal step
        for _ in range(n):
            for r in (0, 1):
                evs.append(
                    StepCompleted(ts=t + step_s, rank=r, step=step, start=t, duration=step_s, **ctx(a))
                )
            t, step = t + step_s, step + 1
        return t

    evs.append(JobStarted(ts=t, script="train.py", nproc_per_node=2, max_restarts=9, **ctx(0)))
    evs.append(AttemptStarted(ts=t, world_size=2, num_nodes=1, **ctx(0)))
    evs.append(WorkersStarted(ts=t, pids=(1, 2), global_ranks=(0, 1), **ctx(0)))
    t = train(0, t)
    for a, (path, re_form, load, first) in enumerate(paths):
        evs.append(
            FailureDetected(ts=t + 3.0, failure="crash", evidence="SIGKILL", onset=t, rank=1, **ctx(a))
        )
        evs.append(WorkersStopped(ts=t + 4.0, reason="rank 1 killed", **ctx(a)))
        evs.append(DecisionTaken(ts=t + 5.0, action="restart", reason="restart: crash", **ctx(a)))
        t += 5.0
        path, _, source = path.partition("+")
        if path != "unknown":
            evs.append(DecisionTaken(ts=t + 0.1, action=f"start_{path}", reason=f"{path}: why", **ctx(a + 1)))
        read = dict(step=step, path="ckpt", duration_s=load / 2, tier=source or "disk", **ctx(a + 1))
        evs.append(CheckpointLoaded(ts=t + re_form + load / 2, rank=0, **read))
        evs.append(AttemptStarted(ts=t + 0.1, world_size=2, num_nodes=1, **ctx(a + 1)))
        evs.append(WorkersStarted(ts=t + re_form, pids=(3, 4), global_ranks=(0, 1), **ctx(a + 1)))
        for r in (0, 1):
            evs.append(TrainingResumed(ts=t + re_form + load, rank=r, step=step, **ctx(a + 1)))
        t += re_form + load + first
        for r in (0, 1):
            evs.append(StepCompleted(ts=t, rank=r, step=step, start=t - first, duration=first, **ctx(a + 1)))
        step += 1
        t = train(a + 1, t)
    evs.append(JobEnded(ts=t + 1.0, verdict="done", outcome="succeeded", exit_code=0, requeue_helps=False))
    return evs


def test_recovery_is_fitted_per_path_with_counts_and_the_mix_weighted_mean():
    from stalwart.sim.fit import mix_weighted_recover_s, recovery_paths

    evs = _recovering_ledger(
        [
            ("warm", 2.0, 3.0, 1.0),
            ("cold", 20.0, 30.0, 4.0),
            ("warm", 4.0, 5.0, 1.0),
            ("warm+peer", 2.0, 9.0, 1.0),
            ("unknown", 1, 1, 1),  # last: recovery.py takes the next start record of any later attempt
        ]
    )
    paths = {p.path: p for p in recovery_paths(evs)}
    assert set(paths) == {"warm", "cold", "unknown", "warm+peer"}
    assert (paths["warm+peer"].count, paths["warm+peer"].recover_s) == (1, pytest.approx(12.0))
    warm, cold = paths["warm"], paths["cold"]
    assert (warm.count, cold.count, paths["unknown"].count) == (2, 1, 1)
    assert warm.recover_s == pytest.approx((6.0 + 10.0) / 2) and cold.recover_s == pytest.approx(54.0)
    assert warm.phases == pytest.approx({"re_form": 3.0, "load": 4.0, "first_step": 1.0})
    assert list(paths)[0] == "warm"  # most frequent first
    assert mix_weighted_recover_s(list(paths.values())) == pytest.approx((6 + 54 + 10 + 3 + 12) / 5)
    fit = fit_run(evs)
    assert {p.path: p.count for p in fit.recover_paths} == {
        "warm": 2,
        "cold": 1,
        "unknown": 1,
        "warm+peer": 1,
    }
    # the one recovery time the simulator keeps is the mix-weighted mean of the paths
    assert fit.recover_s == pytest.approx(mix_weighted_recover_s(fit.recover_paths))


def test_a_recovery_without_its_first_step_is_not_fitted():
    from stalwart.events import StepCompleted
    from stalwart.sim.fit import recovery_paths

    evs = _recovering_ledger([("cold", 20.0, 30.0, 4.0)])
    # the run ended during the load: no step of attempt 1 was ever completed
    cut = [e for e in evs if not (isinstance(e, StepCompleted) and e.attempt == 1)]
    assert recovery_paths(cut) == ()
    assert [p.count for p in recovery_paths(evs)] == [1]


def test_plan_from_a_ledger_reports_recovery_per_path(tmp_path, capsys, monkeypatch):
    import json

    from stalwart import cli
    from stalwart.ledger import LedgerWriter

    paths = [("warm", 2.0, 3.0, 1.0), ("cold", 20.0, 30.0, 4.0)] + [("warm", 2.0, 2.0, 1.0)] * 3
    with LedgerWriter(tmp_path / "ledger" / "a.ledger") as w:
        w.extend(_recovering_ledger(paths, step_s=60.0))
    argv = ["plan", "--ledger", str(tmp_path), "--gpus", "8", "--gpus-per-node", "2", "--days", "1"]
    cli.main([*argv, "--trials", "5", "--json"])
    m = json.loads(capsys.readouterr().out)["measured"]
    got = {p["path"]: (p["count"], p["recover_s"]) for p in m["recover_paths"]}
    assert got == {"warm": (4, pytest.approx((6.0 + 5.0 * 3) / 4)), "cold": (1, pytest.approx(54.0))}
    monkeypatch.setenv("COLUMNS", "80")
    cli.main([*argv, "--trials", "5"])
    out = capsys.readouterr().out
    assert "recovery per path" in out
    warm = next(line for line in out.splitlines() if line.strip().startswith("warm"))
    assert warm.split()[1:3] == ["4", "80.0%"]


def test_a_checkpoint_is_restorable_once_committed_in_the_tier_restarts_read_from():
    # a restart reads the node memory tier, which commits 0.5 s after the snapshot; storage takes
    # 0.7 s. Replayed with the storage lag, a chaos run's lost work came out 3.5 points too high
    from stalwart.events import CheckpointCommitted, CheckpointLoaded, CheckpointStaged
    from stalwart.sim.fit import _persist_s

    ctx = dict(run_id="r", node="n0", attempt=0, rank=0)
    staged = [CheckpointStaged(ts=10.0 * k, step=5 * k, stall_s=0.1, **ctx) for k in (1, 2)]
    commits = [
        CheckpointCommitted(ts=10.0 * k + lag, step=5 * k, path="p", tier=tier, stall_s=0.0, **ctx)
        for k in (1, 2)
        for tier, lag in (("memory", 0.5), ("local", 0.7))
    ]
    memory = CheckpointLoaded(ts=30.0, step=10, path="p", tier="memory", duration_s=0.1, **ctx)
    local = CheckpointLoaded(ts=40.0, step=10, path="p", tier="local", duration_s=0.1, **ctx)
    assert _persist_s(staged, commits, [memory, memory, local]) == pytest.approx(0.5)
    assert _persist_s(staged, commits, [local]) == pytest.approx(0.7)
    assert _persist_s(staged, commits, []) == pytest.approx(0.7)  # no restart yet: every tier
    assert _persist_s([], commits, [memory]) == 0.0
