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
    assert component_class("crash", "XID 79: GPU has fallen off the bus") is Component.GPU
    assert component_class("crash", "Xid 48 double bit ECC") is Component.GPU_MEMORY
    assert component_class("hang", "NCCL watchdog timeout on allreduce") is Component.COMMUNICATION
    assert component_class("crash", "", "RuntimeError", "CUDA out of memory") is Component.USER_CODE
    assert component_class("crash", "mlx5_0 port 1 link down") is Component.IB_LINK
    assert component_class("crash", "nvme0n1: I/O error") is Component.STORAGE
    assert component_class("crash", "GPU thermal slowdown, overheat") is Component.COOLING
    # with no telling evidence, the failure kind says
    assert component_class("hang", "no heartbeat for 300 s") is Component.COMMUNICATION
    assert component_class("agent_lost", "no heartbeat from the agent") is Component.HOST
    assert component_class("peer_lost", "") is Component.UNKNOWN
    assert component_class("not a kind", "") is Component.UNKNOWN
    assert incident_class(Component.GPU_MEMORY) == (FaultClass.HARDWARE, Component.GPU_MEMORY)
    assert incident_class(Component.USER_CODE) == (FaultClass.USER, Component.USER_CODE)
    assert incident_class(Component.EXTERNAL) == (FaultClass.UNKNOWN, Component.EXTERNAL)


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
