"""Failure classes recovered in place: their failures keep the compute since the checkpoint (the
survivors hold the live state), a normal class's failures roll back, and a class's own restart time
replaces the strategy's."""

import pytest

from stalwart.sim import CheckpointTier, FailureClass, SimConfig, simulate

BASE = 300.0  # checkpoint interval (compute seconds)
JOB_RESTART = 60.0
OWN_RESTART = 7.0


def _cfg(in_place: bool = True, restart_s: float | None = OWN_RESTART, **kw) -> SimConfig:
    values = dict(
        gpus=16,
        days=0.5,
        trials=4,
        seed=3,
        failures=[
            FailureClass(name="bug", per_1000_gpu_days=3000.0, node_loss=False, detect_s=10.0),
            FailureClass(
                name="bug (in place)",
                per_1000_gpu_days=3000.0,
                node_loss=False,
                detect_s=10.0,
                in_place=in_place,
                restart_s=restart_s,
            ),
        ],
        planned_per_1000_gpu_days=0.0,
        decide_s=0.0,
        job_restart_s=JOB_RESTART,
        fail_in_recovery=False,  # every recovery finishes: the trace shows each one whole
        tiers=[CheckpointTier(name="fs", interval_s=BASE, stall_s=5.0, restore_s=0.0)],
    )
    values.update(kw)
    return SimConfig(**values)


def _failed_runs(trace: list[dict], name: str) -> list[dict]:
    """The cycles whose run phase a failure of class ``name`` ended after some compute."""
    return [c for c in trace if c["failed"] and c["class"] == name and c["compute"] > 0]


def test_an_in_place_class_keeps_its_compute_while_a_normal_class_rolls_back():
    trace = simulate(_cfg(), trace=True).trace
    placed, normal = _failed_runs(trace, "bug (in place)"), _failed_runs(trace, "bug")
    assert len(placed) >= 5 and len(normal) >= 5
    for c in placed:
        assert c["kept"] == pytest.approx(c["compute"])
    # a rollback goes back to the newest checkpoint: the progress since the job last resumed from one
    # (the in-place cycles' since then included) lands on a multiple of the interval (sim/phase.py)
    progress, after_in_place = 0.0, 0
    for c in trace:
        if not c["failed"] or c["class"] == "bug (in place)":
            progress += c["kept"]
            continue
        back = progress + c["kept"]
        assert 0.0 <= back <= progress + c["compute"] + 1e-6
        assert back / BASE == pytest.approx(round(back / BASE), abs=1e-9), (progress, c)
        after_in_place += progress > 0
        progress = 0.0
    assert after_in_place >= 3  # rollbacks that took back what in-place cycles had kept
    assert any(c["kept"] < c["compute"] - 1.0 for c in normal)  # some work was lost to the rollback


def test_in_place_loses_less_work_than_the_same_class_rolled_back():
    placed = simulate(_cfg())
    rolled = simulate(_cfg(in_place=False))
    assert (placed.interruptions == rolled.interruptions).all()  # the same draws: only the rollback differs
    assert placed.buckets["lost_work"].mean() < rolled.buckets["lost_work"].mean()
    assert placed.ettr.mean() > rolled.ettr.mean()


def test_a_class_restart_time_replaces_the_strategys():
    trace = simulate(_cfg(), trace=True).trace
    after = {JOB_RESTART: 0, OWN_RESTART: 0}
    for prev, cur in zip(trace, trace[1:], strict=False):
        assert prev["failed"] and cur["recovered"]
        want = OWN_RESTART if prev["class"] == "bug (in place)" else JOB_RESTART
        assert cur["restart"] == pytest.approx(want)
        after[want] += 1
    assert min(after.values()) >= 5
    # without its own time the class restarts as the strategy does
    plain = simulate(_cfg(restart_s=None), trace=True).trace
    assert all(c["restart"] == pytest.approx(JOB_RESTART) for c in plain[1:])


def test_the_defaults_are_a_rolled_back_class_with_the_strategys_restart():
    c = FailureClass(name="x", per_1000_gpu_days=1.0)
    assert (c.in_place, c.restart_s) == (False, None)
    for field in ("in_place", "restart_s"):
        assert FailureClass.model_fields[field].description
