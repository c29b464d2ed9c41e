"""``stalwart plan --ledger`` from a 4-rank CPU run, for 16,384 GPUs of a 70B model: the small run's
sub-second restart is not the large job's; each option pays the phases of its mechanism, each phase
says where its figure came from, and cold restarts cost minutes and ETTR (Llama 3's failure rates)."""

from __future__ import annotations

import json

import pytest

from stalwart import cli
from stalwart.events import (
    AttemptStarted,
    ChaosInjected,
    CheckpointCommitted,
    CheckpointStaged,
    DecisionTaken,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
    WorkersStarted,
    WorkersStopped,
)
from stalwart.ledger import LedgerWriter
from stalwart.sim.laws import Source

RANKS = 4
STEP_S = 0.065


def _chaos_run(run_dir, crashes: int = 3) -> None:
    """A 4-rank CPU run like the demo's: chaos kills a rank every 30 steps, the agent recovers on the
    warm path in about 3.5 s (detect 0.27 s, tear down 0.9 s, re-form 1.3 s, load 1.0 s, first step
    0.1 s), a checkpoint every 10 steps stalls 20 ms."""
    t, step, evs = 1_700_000_000.0, 0, []

    def ctx(a):
        return dict(run_id="r", node="n0", attempt=a)

    def train(a, t, n):
        nonlocal step
        for _ in range(n):
            for r in range(RANKS):
                evs.append(
                    StepCompleted(ts=t + STEP_S, rank=r, step=step, start=t, duration=STEP_S, **ctx(a))
                )
            t, step = t + STEP_S, step + 1
            if step % 10 == 0:  # staged in 20 ms, persisted behind the loop in 0.3 s
                evs.append(CheckpointStaged(ts=t + 0.02, step=step, stall_s=0.02, rank=0, **ctx(a)))
                evs.append(
                    CheckpointCommitted(ts=t + 0.32, step=step, path="c", stall_s=0.02, rank=0, **ctx(a))
                )
                t += 0.02
        return t

    evs.append(JobStarted(ts=t, script="train.py", nproc_per_node=RANKS, max_restarts=9, **ctx(0)))
    evs.append(AttemptStarted(ts=t, world_size=RANKS, num_nodes=1, **ctx(0)))
    evs.append(WorkersStarted(ts=t + 4.0, pids=(1, 2, 3, 4), global_ranks=(0, 1, 2, 3), **ctx(0)))
    t = train(0, t + 4.5, 30)
    for a in range(crashes):
        evs.append(
            ChaosInjected(ts=t, fault="crash", step=step, detail=f"crash@rank=1,step={step}", **ctx(a))
        )
        evs.append(
            FailureDetected(ts=t + 0.27, failure="crash", evidence="SIGKILL", onset=t, rank=1, **ctx(a))
        )
        evs.append(WorkersStopped(ts=t + 1.17, reason="rank 1 killed", **ctx(a)))
        evs.append(DecisionTaken(ts=t + 1.17, action="restart", reason="restart: crash", **ctx(a)))
        evs.append(DecisionTaken(ts=t + 1.2, action="start_warm", reason="warm: server ready", **ctx(a + 1)))
        evs.append(AttemptStarted(ts=t + 1.2, world_size=RANKS, num_nodes=1, **ctx(a + 1)))
        evs.append(WorkersStarted(ts=t + 2.47, pids=(5, 6, 7, 8), global_ranks=(0, 1, 2, 3), **ctx(a + 1)))
        step = step // 10 * 10
        for r in range(RANKS):
            evs.append(TrainingResumed(ts=t + 3.47, step=step, rank=r, **ctx(a + 1)))
        t = train(a + 1, t + 3.47, 30)
    evs.append(
        JobEnded(
            ts=t + 1, verdict="ok", outcome="succeeded", exit_code=0, requeue_helps=False, **ctx(crashes)
        )
    )
    with LedgerWriter(run_dir / "ledger" / "agent-n0.ledger") as w:
        w.extend(evs)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    run = tmp_path_factory.mktemp("run4")
    _chaos_run(run)
    plots = run / "plots"
    argv = ["plan", "--ledger", str(run), "--gpus", "16384", "--model", "70b", "--trials", "60", "--json"]
    argv += ["--plot", str(plots), "--plot-format", "svg"]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(argv)
    return json.loads(out.getvalue())


def _phases(d, option, when):
    return {r["phase"]: r for r in d["phases"] if r["option"] == option and r["when"] == when}


def _recovery(d, option, when="node_loss"):
    rows = _phases(d, option, when)
    return sum(r["seconds"] for r in rows.values())


def test_the_small_runs_restart_is_not_presented_as_the_large_jobs(planned):
    assert planned["measured"]["recover_s"] < 5.0  # the 4-rank run recovered in seconds
    assert any("is not the job's at 16,384 GPUs" in n for n in planned["notes"])
    # cold: minutes, and every phase with its source
    cold = _recovery(planned, "cold")
    assert cold > 60.0
    for r in planned["phases"]:
        assert r["source"] in {s.value for s in Source} and r["note"], r
    cold_rows = _phases(planned, "cold", "node_loss")
    assert cold_rows["pg_init"]["source"] == "fitted" and "NCCLX" in cold_rows["pg_init"]["note"]
    assert cold_rows["rendezvous"]["source"] == "published"
    assert cold_rows["tear_down"]["source"] == "measured" and "4-rank run" in cold_rows["tear_down"]["note"]
    assert cold_rows["restore"]["source"] == "derived" and "GB" in cold_rows["restore"]["note"]


def test_warm_and_in_place_are_cheaper_by_their_mechanism(planned):
    cold_soft, warm_soft = _phases(planned, "cold", "soft"), _phases(planned, "warm", "soft")
    in_place = _phases(planned, "in_place", "soft")
    assert "spawn" in cold_soft and "fork" in warm_soft and "spawn" not in warm_soft  # no imports
    assert (
        "fork" not in in_place and "spawn" not in in_place and "cuda_init" not in in_place
    )  # survivors stay
    assert "abort" in in_place
    assert "host copy" in warm_soft["restore"]["note"] and "live replica" in in_place["restore"]["note"]
    assert _recovery(planned, "warm", "soft") < _recovery(planned, "cold", "soft")
    # a lost node's replacement has no pre-imported server: warm is no faster there, in-place is
    assert _recovery(planned, "warm", "node_loss") == pytest.approx(_recovery(planned, "cold", "node_loss"))
    for when in ("soft", "node_loss"):
        assert _recovery(planned, "in_place", when) < _recovery(planned, "cold", when)


def test_cold_ettr_at_16k_is_at_most_097_and_the_options_differ(planned):
    at = {o["option"]: o for o in planned["options"] if o["gpus"] == 16384}
    assert at["cold"]["ettr"] <= 0.97
    assert at["in_place"]["ettr"] > at["warm"]["ettr"] > at["cold"]["ettr"]
    assert len({round(o["ettr"], 4) for o in at.values()}) >= 5
    for o in at.values():
        assert o["ettr_p5"] <= o["ettr"] <= o["ettr_p95"]
    assert planned["strategy"]["value"] == max(at.values(), key=lambda o: o["ettr"])["option"]


def test_ettr_falls_with_size_for_every_option(planned):
    for name in {o["option"] for o in planned["options"]}:
        rows = sorted((o for o in planned["options"] if o["option"] == name), key=lambda o: o["gpus"])
        ettr = [o["ettr"] for o in rows]
        assert ettr == sorted(ettr, reverse=True), (name, ettr)


def test_the_ettr_chart_shades_every_options_band(planned):
    svg = next(p for p in planned["plots"] if p.endswith("ettr_vs_gpus.svg"))
    text = open(svg).read()
    assert text.count("PolyCollection_") == len({o["option"] for o in planned["options"]})


def test_measured_in_place_phases_feed_the_in_place_laws(tmp_path, capsys):
    from test_sim_laws import INPLACE

    run = tmp_path / "run"
    _chaos_run(run, crashes=2)
    table = tmp_path / "inplace-phases.json"
    table.write_text(json.dumps({"ranks": {str(r): p for r, p in INPLACE.items()}}))
    argv = ["plan", "--ledger", str(run), "--gpus", "16", "--gpus-per-node", "4", "--model", "8b"]
    cli.main(
        [
            *argv,
            "--model-parallel",
            "4",
            "--trials",
            "20",
            "--scale-to",
            "1024",
            "--json",
            "--inplace-phases",
            str(table),
        ]
    )
    d = json.loads(capsys.readouterr().out)
    assert any("in-place phases measured at 2, 4, 8, 16 ranks" in n for n in d["notes"])
    rows = _phases(d, "in_place", "soft")
    # at 16 ranks, a measured size: the benchmark's figures as they are
    assert rows["abort"]["source"] == "measured" and rows["abort"]["seconds"] == INPLACE[16]["abort_s"]
    assert (
        rows["pg_init"]["seconds"] == INPLACE[16]["pg_init_s"]
        and "in-place benchmark" in rows["pg_init"]["note"]
    )
    table.write_text(json.dumps({"ranks": {"4": {"abort_s": "fast"}}}))
    with pytest.raises(SystemExit):
        cli.main([*argv, "--trials", "5", "--inplace-phases", str(table)])
    assert "abort_s at 4 ranks" in capsys.readouterr().err


def test_plan_recommends_what_checkpoint_every_auto_would_choose_for_the_run(planned, tmp_path):
    from stalwart.checkpoint import advisor

    if not hasattr(advisor, "recommend_from_ledger"):
        pytest.skip("--checkpoint-every auto's decision (issue 27) is not in this tree yet")
    from stalwart.ledger import read_merged

    run = tmp_path / "run"
    _chaos_run(run)
    choice = advisor.recommend_from_ledger(read_merged(run))
    assert choice is not None
    got = planned["measured"]["auto_interval"]
    assert got["steps"] == choice.steps and got["reason"] == choice.reason


@pytest.mark.parametrize(
    "flags,says",
    [(["--model", "13b"], "invalid --model"), (["--network-gbps", "-3"], "invalid --network-gbps")],
)
def test_a_bad_target_job_is_one_line_naming_its_flag(capsys, flags, says):
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", "--gpus", "64", "--trials", "5", *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_run_checkpointing_faster_than_the_target_jobs_stall_still_plans(tmp_path, monkeypatch, capsys):
    """A small run's checkpoint interval (10 steps of 5 ms) is far shorter than the target job's
    modelled stall: the plan seeds its interval at no less than one stall and re-optimises it, instead
    of refusing the run's interval as a unit error (a CI run on a fast machine failed this way)."""
    monkeypatch.setitem(globals(), "STEP_S", 0.005)
    _chaos_run(tmp_path)
    cli.main(["plan", "--ledger", str(tmp_path), "--gpus", "64", "--trials", "20", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["measured"]["interval_s"] < 0.1  # the run's own interval was that short
    (tier,) = d["tiers"]
    assert tier["current_s"] > d["measured"]["interval_s"]
    assert tier["recommended_s"] > tier["current_s"]
