"""Silent collectors become incidents; an incident naming an HCA becomes NCCL_IB_HCA changes."""

from __future__ import annotations

import pytest

from stalwart.diagnose.cross_layer import diagnose_comm_failure
from stalwart.diagnose.incident import Component, FaultClass
from stalwart.diagnose.route_around import route_around_hca, route_incident
from stalwart.diagnose.signals import Signal, from_findings
from stalwart.diagnose.watchers import Watched, silent_watchers
from stalwart.errors import ConfigError
from stalwart.health.findings import Finding, Severity


def test_a_collector_silent_past_k_intervals_is_an_incident():
    srcs = [
        Watched("nvml collector", "n1", 10.0, started=0.0, last_report=950.0),
        Watched("kernel-log reader", "n2", 10.0, started=0.0, last_report=985.0),
        Watched("straggler detector", "n3", 60.0, started=800.0),
    ]
    incs = silent_watchers(srcs, now=1000.0, k=3)
    assert [i.blast_radius.nodes for i in incs] == [("n1",), ("n3",)]
    nvml, det = incs
    assert nvml.component is Component.COLLECTOR and nvml.fault_class is FaultClass.SYSTEM
    assert nvml.cause.startswith(
        "nvml collector on n1 is silent: last reported 50 s ago, expected every 10 s"
    )
    assert "has not reported since it started 200 s ago" in det.cause
    assert nvml.onset == 960.0


def test_exactly_at_the_limit_is_not_silent_and_k_is_checked():
    assert silent_watchers([Watched("x", "n", 10.0, 0.0, 70.0)], now=100.0, k=3) == ()
    with pytest.raises(ConfigError, match="k must be >= 1"):
        silent_watchers([], now=0.0, k=0.5)
    with pytest.raises(ConfigError, match="expected interval"):
        Watched("x", "n", 0.0, 0.0)


@pytest.mark.parametrize(
    "current,hca,available,expected",
    [
        ("", "mlx5_3", (), "^=mlx5_3"),
        ("", "mlx5_3/1", (), "^=mlx5_3:1"),
        ("^=mlx5_7", "mlx5_3", (), "^=mlx5_7,mlx5_3"),
        ("^mlx5_7", "mlx5_3", (), "^mlx5_7,mlx5_3"),
        ("=mlx5_0,mlx5_3,mlx5_4", "mlx5_3", (), "=mlx5_0,mlx5_4"),
        ("mlx5_0:1,mlx5_3:1", "mlx5_3", (), "mlx5_0:1"),
        ("mlx5", "mlx5_3", ("mlx5_0", "mlx5_3", "mlx5_4"), "=mlx5_0,mlx5_4"),
    ],
)
def test_nccl_ib_hca_for_the_next_attempt(current, hca, available, expected):
    change = route_around_hca(hca, {"NCCL_IB_HCA": current} if current else {}, available)
    assert change.possible and change.env == (("NCCL_IB_HCA", expected),)


@pytest.mark.parametrize(
    "current,hca,why",
    [
        ("^=mlx5_3", "mlx5_3", "already excluded"),
        ("=mlx5_3", "mlx5_3", "only HCA"),
        ("=mlx5_0", "mlx5_3", "does not use mlx5_3"),
        ("mlx5", "mlx5_3", "pass the node's HCA names"),
    ],
)
def test_no_route_when_it_cannot_help(current, hca, why):
    change = route_around_hca(hca, {"NCCL_IB_HCA": current})
    assert not change.possible and change.env == () and why in change.reason


def test_bad_hca_name():
    with pytest.raises(ConfigError, match="not an HCA name"):
        route_around_hca("mlx5 3; rm -rf", {})


def test_ib_incident_becomes_a_route_around_with_the_text_saying_so():
    down = Finding("infiniband", "ib.state", "mlx5_3/1", Severity.FAIL, "port state DOWN")
    sym = [Signal(ts=100.0, node="n1", code="comm.error", text="NET/IB: completion error hca mlx5_3", rank=0)]
    inc = diagnose_comm_failure(sym, from_findings([down], "n1", 90.0), now=120.0)
    routed = route_incident(inc, "mlx5_3/1", {})
    assert routed.action == "route_around_hca" and dict(routed.env) == {"NCCL_IB_HCA": "^=mlx5_3:1"}
    assert "next attempt routes around mlx5_3/1" in routed.cause
    assert routed.to_event().env == {"NCCL_IB_HCA": "^=mlx5_3:1"}
    stuck = route_incident(inc, "mlx5_3", {"NCCL_IB_HCA": "=mlx5_3"})
    assert stuck.action == "drain_check_link" and stuck.env == () and "no path left" in stuck.evidence[-1]


def test_only_nic_incidents_can_be_routed():
    sym = [Signal(ts=100.0, node="n1", code="comm.timeout", rank=0)]
    inc = diagnose_comm_failure(sym, [], now=120.0)
    with pytest.raises(ConfigError, match="not a NIC"):
        route_incident(inc, "mlx5_3", {})
