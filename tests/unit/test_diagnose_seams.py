"""Topology, facility signals, the cooling seam and the blast-radius policy."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from stalwart.diagnose.facility import (
    FacilitySample,
    PrometheusFacility,
    cooling_trend,
    fetch_prometheus,
    load_facility_file,
    parse_facility_json,
)
from stalwart.diagnose.incident import Component, FaultClass
from stalwart.diagnose.seams import NodeFault, SeamConfig, SlowRank, blast_radius, cooling_seams
from stalwart.diagnose.signals import from_findings
from stalwart.diagnose.topology import load_topology, parse_topology_csv
from stalwart.errors import ConfigError, TelemetryError
from stalwart.health.gpu_fixtures import load_gpu_fixture
from stalwart.health.passive_checks import PassiveThresholds, check_gpus

FIX = Path(__file__).parents[1] / "fixtures"
DERIVED = FIX / "gpu" / "h100_derived"
TOPO = FIX / "diagnose" / "topology.yaml"


def thermal_signals(node: str, start: float, fixture: str = "burn_hw_thermal"):
    """Findings of the recorded H100 burn (with the planted HW thermal window), placed at ``start``."""
    return from_findings(check_gpus(load_gpu_fixture(DERIVED / fixture), PassiveThresholds()), node, start)


# --- topology ------------------------------------------------------------------------------------


def test_yaml_and_csv_topologies_agree():
    y, c = load_topology(TOPO), load_topology(FIX / "diagnose" / "topology.csv")
    assert y == c
    assert y.domain_of("n4", "leaf_switch") == "sw1" and y.domain_of("n4", "cooling_loop") == "loopB"
    assert y.members("leaf_switch", "sw1") == ("n1", "n2", "n3", "n4")
    assert y.domain_of("nX", "rack") == ""


@pytest.mark.parametrize(
    "text,msg",
    [
        ("node,rack\nn1,r1\nn1,r2\n", "listed twice"),
        ("rack,pdu\nr1,p1\n", "header with a 'node' column"),
        ("node,rack,floor\nn1,r1,3\n", "n1.floor"),
    ],
)
def test_bad_csv_topology_is_one_clear_error(text, msg):
    with pytest.raises(ConfigError, match=msg):
        parse_topology_csv(text)


def test_bad_yaml_topology(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("nodes: []\n")
    with pytest.raises(ConfigError, match="non-empty 'nodes' mapping"):
        load_topology(p)
    with pytest.raises(ConfigError, match="cannot read topology"):
        load_topology(tmp_path / "missing.yaml")


# --- facility signals ----------------------------------------------------------------------------


def test_facility_file_trend_rising_on_loop_a_only():
    samples = load_facility_file(FIX / "diagnose" / "facility_loopA_rising.csv")
    a = cooling_trend(samples, "loopA", 0, 900)
    b = cooling_trend(samples, "loopB", 0, 900)
    assert a.degraded and a.inlet_rise_c > 3 and a.flow_drop_fraction == pytest.approx(0.15, abs=0.06)
    assert not b.degraded and b.inlet_rise_c == pytest.approx(0.0)
    assert "loopA degraded" in a.reason
    assert not cooling_trend(samples, "loopC", 0, 900).degraded


def test_pump_stop_alone_is_degraded():
    s = [FacilitySample(0, "l", "pump_on", 1), FacilitySample(10, "l", "pump_on", 0)]
    assert cooling_trend(s, "l", 0, 10).pump_stopped


def test_bad_facility_json():
    with pytest.raises(TelemetryError, match="unknown facility metric"):
        parse_facility_json('[{"ts": 1, "loop": "a", "metric": "humidity", "value": 3}]')
    with pytest.raises(TelemetryError, match="not valid JSON"):
        parse_facility_json("[{")


class _FakeProm(BaseHTTPRequestHandler):
    answers: dict[str, object] = {}
    seen: list[dict] = []

    def do_GET(self):  # noqa: N802
        q = parse_qs(urlparse(self.path).query)
        type(self).seen.append(q)
        body = self.answers.get(q["query"][0])
        if body is None:
            self.send_response(400)
            payload = {"status": "error", "error": "parse error at char 1"}
        else:
            self.send_response(200)
            payload = body
        raw = json.dumps(payload).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture
def prom():
    srv = HTTPServer(("127.0.0.1", 0), _FakeProm)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    _FakeProm.seen = []
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()
    th.join(timeout=5)


def test_prometheus_query_range_on_a_loopback_fake(prom):
    _FakeProm.answers = {
        "cdu_inlet_celsius": {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {"metric": {"loop": "loopA"}, "values": [[100, "24.0"], [400, "26.5"], [700, "30.5"]]}
                ],
            },
        }
    }
    cfg = PrometheusFacility(url=prom, queries={"inlet_temp_c": "cdu_inlet_celsius"}, timeout_s=2)
    samples = fetch_prometheus(cfg, 100, 700, step_s=300)
    assert [s.value for s in samples] == [24.0, 26.5, 30.5] and {s.loop for s in samples} == {"loopA"}
    assert _FakeProm.seen[0]["start"] == ["100.000"] and _FakeProm.seen[0]["step"] == ["300"]
    assert cooling_trend(samples, "loopA", 0, 1000).degraded


def test_prometheus_errors_are_telemetry_errors(prom):
    _FakeProm.answers = {
        "no_label": {"status": "success", "data": {"result": [{"metric": {}, "values": [[1, "2"]]}]}}
    }
    with pytest.raises(TelemetryError, match="HTTP 400 parse error"):
        fetch_prometheus(PrometheusFacility(url=prom, queries={"inlet_temp_c": "bad("}), 0, 10)
    with pytest.raises(TelemetryError, match="no 'loop' label"):
        fetch_prometheus(PrometheusFacility(url=prom, queries={"inlet_temp_c": "no_label"}), 0, 10)


def test_prometheus_unreachable_is_bounded_and_clear():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(TelemetryError, match="no answer within 0.5 s"):
        fetch_prometheus(
            PrometheusFacility(url=f"http://127.0.0.1:{port}", queries={"pump_on": "p"}, timeout_s=0.5), 0, 10
        )


def test_prometheus_config_is_validated():
    with pytest.raises(ConfigError, match="unknown facility metric"):
        PrometheusFacility(url="http://x", queries={"humidity": "h"})
    with pytest.raises(ConfigError, match="must start with http"):
        PrometheusFacility(url="x:9090", queries={"pump_on": "p"})


# --- cooling seam (acceptance a) -----------------------------------------------------------------


def test_slow_rank_in_thermal_slowdown_on_a_warming_loop_is_one_cooling_seam_incident_with_cost():
    topo = load_topology(TOPO)
    facility = load_facility_file(FIX / "diagnose" / "facility_loopA_rising.csv")
    sigs = thermal_signals("n2", 800.0) + thermal_signals("n3", 790.0)  # HW thermal from t = 840 / 830 s
    slow = [
        SlowRank("n2", 5, since=600.0, slowdown=1.5, evidence="own work 150 ms vs 100 ms"),
        SlowRank("n3", 6, since=650.0, slowdown=1.3),
    ]
    incs = cooling_seams(slow, sigs, facility, topo, now=900.0, gpus=48)
    assert len(incs) == 1
    inc = incs[0]
    assert inc.rule == "seam:cooling-loop" and inc.fault_class is FaultClass.FACILITY
    assert inc.component is Component.COOLING and inc.action == "facility_alert_no_rma"
    assert inc.blast_radius.domain == "cooling_loop:loopA" and inc.blast_radius.nodes == ("n1", "n2", "n3")
    assert inc.blast_radius.ranks == (5, 6)
    assert "loop loopA" in inc.cause and "rank 5 on n2" in inc.cause
    # cost: 48 GPUs x 300 s slow at 1.5x -> a third of the job's time lost
    assert inc.cost_gpu_s == pytest.approx(48 * 300 * (1 - 1 / 1.5))
    assert any("hw_thermal" in line for line in inc.evidence) and any(
        "inlet" in line for line in inc.evidence
    )


def test_thermal_straggler_on_a_normal_loop_is_a_gpu_local_cooling_defect():
    topo = load_topology(TOPO)
    facility = load_facility_file(FIX / "diagnose" / "facility_loopA_rising.csv")
    incs = cooling_seams(
        [SlowRank("n5", 9, 600.0, 1.4)], thermal_signals("n5", 800.0), facility, topo, now=900.0, gpus=48
    )
    assert len(incs) == 1 and incs[0].rule == "seam:gpu-local-cooling"
    assert incs[0].fault_class is FaultClass.HARDWARE and incs[0].blast_radius.nodes == ("n5",)
    assert "loopB normal" in incs[0].cause


def test_straggler_without_thermal_signal_is_not_a_cooling_incident():
    """The real burn (SW power cap only under load) is not thermal slowdown."""
    topo = load_topology(TOPO)
    facility = load_facility_file(FIX / "diagnose" / "facility_loopA_rising.csv")
    sigs = thermal_signals("n2", 800.0, fixture="healthy_burn")
    assert cooling_seams([SlowRank("n2", 5, 600.0, 1.5)], sigs, facility, topo, now=900.0, gpus=48) == ()


# --- shared cause and blast radius (acceptance c) ------------------------------------------------


def test_faults_on_three_nodes_under_one_leaf_switch_are_one_shared_cause_and_no_mass_drain():
    topo = load_topology(TOPO)
    faults = [
        NodeFault("n1", 1000, "ib.state mlx5_0/1 DOWN"),
        NodeFault("n2", 1030, "comm timeout"),
        NodeFault("n4", 1100, "ib.link_downed mlx5_1/1"),
    ]
    d = blast_radius(faults, topo, now=1120)
    assert d.drain == () and set(d.hold) == {"n1", "n2", "n4"}
    assert len(d.incidents) == 1
    inc = d.incidents[0]
    assert inc.component is Component.SWITCH and inc.blast_radius.domain == "leaf_switch:sw1"
    assert inc.rule == "seam:shared-leaf_switch" and len(inc.evidence) == 3
    assert d.reason.startswith("do not mass drain: shared cause <leaf_switch sw1>")


def test_three_faults_spread_over_domains_drain_independently_up_to_the_cap():
    topo = load_topology(TOPO)
    faults = [
        NodeFault("n1", 1000, "xid 79"),
        NodeFault("n5", 1010, "xid 48"),
        NodeFault("n6", 1020, "xid 48"),
    ]
    d = blast_radius(faults, topo, now=1100, cfg=SeamConfig(max_drains=2))
    assert d.incidents == () and d.drain == ("n1", "n5") and d.hold == ("n6",)
    assert "drain cap 2 reached" in d.reason


def test_faults_far_apart_in_time_are_not_a_shared_cause():
    topo = load_topology(TOPO)
    faults = [NodeFault("n1", 0, "a"), NodeFault("n2", 2000, "b"), NodeFault("n3", 4000, "c")]
    d = blast_radius(faults, topo, now=4010, cfg=SeamConfig(max_drains=5))
    assert d.incidents == () and d.drain == ("n3",)


def test_ib_incidents_on_three_nodes_of_one_switch_feed_the_blast_radius_policy():
    from stalwart.diagnose.cross_layer import diagnose_comm_failure
    from stalwart.diagnose.signals import Signal
    from stalwart.health.findings import Finding, Severity

    incs = []
    for node, t in (("n1", 1000.0), ("n2", 1040.0), ("n3", 1090.0)):
        down = Finding("infiniband", "ib.state", "mlx5_0/1", Severity.FAIL, "port state DOWN")
        sym = [Signal(ts=t + 5, node=node, code="comm.error", text="NCCL remote error", rank=0)]
        incs.append(diagnose_comm_failure(sym, from_findings([down], node, t), now=t + 10))
    faults = NodeFault.from_incidents(incs)
    assert [f.node for f in faults] == ["n1", "n2", "n3"] and faults[0].ts == 1000.0
    d = blast_radius(faults, load_topology(TOPO), now=1100.0)
    assert d.drain == () and len(d.incidents) == 1 and d.incidents[0].blast_radius.domain == "leaf_switch:sw1"
    assert NodeFault.from_incidents(d.incidents) == ()  # a shared-cause incident is not a node fault
