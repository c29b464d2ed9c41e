"""The repair pipeline: diagnosis quality, lemon nodes and their retirement, a spare's join time."""

from __future__ import annotations

import numpy as np
import pytest

from stalwart.sim import FailureClass, SimConfig, simulate
from stalwart.sim.repair import RepairPipeline, effective, lemon_factor, repeat_factor


def _cfg(**repair):
    return SimConfig(gpus=4096, days=20, trials=200, seed=5, spare_nodes=8, repair=RepairPipeline(**repair))


def test_the_identity_pipeline_changes_nothing():
    cfg = _cfg()
    assert effective(cfg) is cfg


def test_worse_diagnosis_means_more_failures_and_less_ettr():
    runs = [simulate(_cfg(diagnosis_accuracy=p)) for p in (1.0, 0.9, 0.7)]
    inter = [float(r.interruptions.mean()) for r in runs]
    ettr = [float(r.ettr.mean()) for r in runs]
    assert inter == sorted(inter) and inter[0] < inter[-1]
    assert ettr == sorted(ettr, reverse=True) and ettr[0] > ettr[-1]


@pytest.mark.parametrize("p", [0.5, 0.8, 0.95])
def test_retiring_a_node_bounds_the_repeats_of_a_misdiagnosed_fault(p):
    free = repeat_factor(RepairPipeline(diagnosis_accuracy=p))
    assert free == pytest.approx(1.0 / p)
    bounded = [repeat_factor(RepairPipeline(diagnosis_accuracy=p, retire_after=k)) for k in (1, 2, 4, 64)]
    assert bounded[0] == pytest.approx(1.0)  # retired at its first failure: no repeat
    assert bounded == sorted(bounded) and bounded[-1] <= free


def test_lemons_cost_more_until_retired():
    per_node = 0.5  # a normal node's node faults over the run
    lemons = RepairPipeline(lemon_fraction=0.05, lemon_multiplier=20.0)
    assert lemon_factor(lemons, per_node) == pytest.approx(0.95 + 0.05 * 20.0)
    retired = [lemon_factor(lemons.model_copy(update={"retire_after": k}), per_node) for k in (1, 3, 10)]
    assert retired == sorted(retired) and retired[-1] <= lemon_factor(lemons, per_node)
    assert lemon_factor(RepairPipeline(), per_node) == 1.0
    many = simulate(_cfg(lemon_fraction=0.05, lemon_multiplier=50.0))
    culled = simulate(_cfg(lemon_fraction=0.05, lemon_multiplier=50.0, retire_after=1))
    assert culled.interruptions.mean() < many.interruptions.mean()
    assert culled.ettr.mean() > many.ettr.mean()


def test_a_spare_that_must_join_costs_each_node_loss_its_join_time():
    cls = [
        FailureClass(name="gpu", per_1000_gpu_days=2.0, node_loss=True, detect_s=30.0),
        FailureClass(name="bug", per_1000_gpu_days=2.0, node_loss=False, detect_s=30.0),
    ]
    kw = dict(gpus=1024, days=10, trials=100, seed=2, failures=cls, planned_per_1000_gpu_days=0.0)
    warm = simulate(SimConfig(**kw))
    cold = simulate(SimConfig(**kw, repair=RepairPipeline(spare_join_s=900.0)))
    down = ("restart", "checkpoint_restore")  # a restore a failure cut short is booked as restart
    extra = sum(cold.buckets[b] - warm.buckets[b] for b in down)
    # the same draws: every node loss (and only those) pays up to 900 s more (a failure may cut it)
    assert np.all(extra <= 900.0 * warm.by_class["gpu"] + 1e-6)
    assert extra.mean() > 0.8 * 900.0 * warm.by_class["gpu"].mean()
    assert cold.ettr.mean() < warm.ettr.mean()


def test_faults_blamed_on_a_node_send_it_to_repair():
    cfg = effective(_cfg(false_repair=0.25))
    blamed = [f for f in cfg.failures if f.name.endswith("_blamed_node")]
    assert blamed and all(f.node_loss for f in blamed)
    total = sum(f.per_1000_gpu_days for f in cfg.failures)
    assert total == pytest.approx(sum(f.per_1000_gpu_days for f in _cfg().failures))
