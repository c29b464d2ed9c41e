"""Crash classification, component classes and lemon nodes, as moved into diagnose/."""

from __future__ import annotations

import math

import pytest

from stalwart.diagnose.incident import Component, FaultClass
from stalwart.diagnose.lemon import lemon_incidents, lemon_scores, poisson_sf
from stalwart.diagnose.root_cause import component_class, incident_class
from stalwart.errors import ConfigError

# classify/read_error are tested in test_failure_classify.py and test_failure_sources.py


def test_component_classes_and_their_incident_class():
    assert component_class("crash", "XID 79: GPU has fallen off the bus") == "gpu"
    assert component_class("crash", "Xid 48 double bit ECC") == "gpu_memory"
    assert component_class("hang", "NCCL watchdog timeout on allreduce") == "nccl_timeout"
    assert component_class("crash", "", "RuntimeError", "CUDA out of memory") == "software"
    assert component_class("hang", "no heartbeat for 300 s") == "hang"
    assert component_class("preempted", "SIGTERM from scheduler") == "planned"
    assert incident_class("gpu_memory") == (FaultClass.HARDWARE, Component.GPU_MEMORY)
    assert incident_class("software") == (FaultClass.USER, Component.USER_CODE)
    assert incident_class("planned") == (FaultClass.UNKNOWN, Component.UNKNOWN)


def test_poisson_tail_against_direct_sum():
    mu, k = 2.5, 6
    direct = 1 - sum(math.exp(-mu) * mu**j / math.factorial(j) for j in range(k))
    assert poisson_sf(k, mu) == pytest.approx(direct, rel=1e-12)
    assert poisson_sf(0, mu) == 1.0


def test_lemon_node_stands_out_and_becomes_one_incident():
    days = {f"n{i:03d}": 30.0 for i in range(100)}
    fails = {f"n{i:03d}": 1 for i in range(0, 100, 4)}
    fails["n042"] = 6
    scores = lemon_scores(fails, days, alpha=0.01)
    assert scores[0].node == "n042" and scores[0].lemon and not any(s.lemon for s in scores[1:])
    incs = lemon_incidents(scores, now=10.0)
    assert (
        len(incs) == 1
        and incs[0].blast_radius.nodes == ("n042",)
        and incs[0].action == "quarantine_rma_review"
    )
    assert incs[0].confidence > 0.99 - 1e-9


def test_uniform_fleet_has_no_lemon_and_bad_exposure_is_an_error():
    days = {f"n{i}": 10.0 for i in range(50)}
    assert lemon_incidents(lemon_scores({f"n{i}": 2 for i in range(50)}, days), now=0.0) == ()
    with pytest.raises(ConfigError, match="without exposure"):
        lemon_scores({"x": 1}, {"y": 1.0})
