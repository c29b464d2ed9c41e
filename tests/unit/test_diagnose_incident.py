"""The incident model: validation, summary text, cost of a slowdown, ledger event."""

from __future__ import annotations

import pytest

from stalwart.diagnose.incident import BlastRadius, Component, FaultClass, Incident, slowdown_cost_gpu_s
from stalwart.errors import ConfigError
from stalwart.events import IncidentRaised, decode, encode


def inc(**kw):
    base = dict(
        cause="GPU fell off the bus",
        fault_class=FaultClass.HARDWARE,
        component=Component.GPU,
        confidence=0.9,
        action="drain_power_cycle",
        ts=100.0,
        onset=90.0,
        rule="r",
    )
    return Incident(**{**base, **kw})


def test_summary_says_class_confidence_action_radius_and_cost():
    i = inc(blast_radius=BlastRadius(nodes=("n2",), ranks=(4, 5)), cost_gpu_s=7200.0)
    assert i.summary == (
        "GPU fell off the bus [hardware/gpu, confidence 0.90; recommend drain_power_cycle; "
        "blast radius n2 (ranks 4, 5); cost 2.00 GPU-h]"
    )
    taken = inc(action_taken=True, blast_radius=BlastRadius(domain="leaf_switch:sw1"))
    assert "took drain_power_cycle; blast radius leaf_switch:sw1]" in taken.summary


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"confidence": 1.2}, "confidence"),
        ({"cost_gpu_s": -1.0}, "cost"),
        ({"cost_gpu_s": float("nan")}, "cost"),
    ],
)
def test_bad_values_are_refused(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        inc(**kw)


def test_slowdown_cost():
    assert slowdown_cost_gpu_s(64, 2.0, 100.0) == pytest.approx(3200.0)
    assert slowdown_cost_gpu_s(64, 0.9, 100.0) == 0.0  # faster is no loss
    with pytest.raises(ConfigError):
        slowdown_cost_gpu_s(8, 0.0, 1.0)


def test_event_carries_everything_and_single_rank_becomes_the_event_rank():
    i = inc(
        evidence=("a", "b"),
        blast_radius=BlastRadius(nodes=("n2", "n3"), ranks=(7,), domain="rack:r1"),
        env=(("NCCL_IB_HCA", "^=mlx5_3"),),
    )
    ev = i.to_event(run_id="run", attempt=2)
    assert isinstance(ev, IncidentRaised)
    assert (ev.node, ev.rank, ev.attempt, ev.domain) == ("n2", 7, 2, "rack:r1")
    assert ev.env == {"NCCL_IB_HCA": "^=mlx5_3"} and ev.evidence == ("a", "b")
    assert decode(*encode(ev)) == ev


def test_incident_survives_the_ledger(tmp_path):
    from stalwart.ledger.store import LedgerWriter, read_file

    ev = inc(evidence=("x",), blast_radius=BlastRadius(nodes=("n1",), ranks=(0, 1))).to_event(run_id="r")
    with LedgerWriter(tmp_path / "l.db") as w:
        w.append(ev)
    assert read_file(tmp_path / "l.db") == [ev]
