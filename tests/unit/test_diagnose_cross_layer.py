"""Cross-layer rules: a communication symptom joined with node evidence names the real cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.diagnose.cross_layer import diagnose_comm_failure, load_cross_rules
from stalwart.diagnose.incident import Component, FaultClass
from stalwart.diagnose.signals import Signal, from_failure, from_findings, from_kernel_log
from stalwart.errors import ConfigError
from stalwart.events import FailureDetected, IncidentRaised, decode, encode
from stalwart.health.findings import Finding, Severity
from stalwart.health.gpu_fixtures import load_gpu_fixture
from stalwart.health.kernel_log import read_kernel_log_file
from stalwart.health.passive_checks import PassiveThresholds, check_gpus

DERIVED = Path(__file__).parents[1] / "fixtures" / "gpu" / "h100_derived"
BOOT = 1_700_000_000.0  # wall-clock time the recorded node booted
T0 = BOOT + 830.0  # the watchdog timeout, ~18 s after the Xid 79 at 812 s since boot


def watchdog(node: str, rank: int, ts: float = T0) -> Signal:
    return from_failure(
        FailureDetected(
            ts=ts + 1,
            node=node,
            rank=rank,
            failure="crash",
            onset=ts,
            exit_code=1,
            error_type="DistBackendError",
            evidence="rank exited",
            error_message="[Rank 0] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600081 milliseconds before timing out.",
        )
    )


def symptoms_on_every_rank() -> list[Signal]:
    return [watchdog("n1", 0), watchdog("n1", 1), watchdog("n2", 2), watchdog("n2", 3)]


def test_comm_timeout_plus_xid79_is_a_gpu_off_the_bus_not_an_nccl_error():
    klog = read_kernel_log_file(DERIVED / "xid79_kmsg" / "kmsg.txt")
    evidence = from_kernel_log(klog, "n2", BOOT)
    inc = diagnose_comm_failure(symptoms_on_every_rank(), evidence, now=T0 + 60, gpus=4)
    assert inc is not None
    assert inc.rule == "cross_layer:gpu-fell-off-bus"
    assert (inc.fault_class, inc.component) == (FaultClass.HARDWARE, Component.GPU)
    assert "fell off the bus" in inc.cause and "0000:00:06" in inc.cause and "n2" in inc.cause
    assert "nccl" not in inc.cause.lower().replace("communication", "")
    assert inc.confidence == pytest.approx(0.95)
    assert inc.blast_radius.nodes == ("n2",) and inc.blast_radius.ranks == (2, 3)
    assert inc.action == "drain_power_cycle"
    assert any("Xid (PCI:0000:00:06): 79" in line for line in inc.evidence)
    assert inc.onset == pytest.approx(BOOT + 812.345678)  # the Xid, not the timeout, is the onset
    assert inc.cost_gpu_s == pytest.approx(4 * 60.0)


def test_xid_on_a_node_that_reported_nothing_still_counts_with_less_confidence():
    klog = read_kernel_log_file(DERIVED / "xid79_kmsg" / "kmsg.txt")
    inc = diagnose_comm_failure([watchdog("n1", 0)], from_kernel_log(klog, "n9", BOOT), now=T0)
    assert inc.rule == "cross_layer:gpu-fell-off-bus" and inc.confidence == pytest.approx(0.95 * 0.9)


def test_xid_outside_the_window_does_not_explain_the_timeout():
    klog = read_kernel_log_file(DERIVED / "xid79_kmsg" / "kmsg.txt")
    late = diagnose_comm_failure(symptoms_on_every_rank(), from_kernel_log(klog, "n2", BOOT + 5000), now=T0)
    early = diagnose_comm_failure(symptoms_on_every_rank(), from_kernel_log(klog, "n2", BOOT - 5000), now=T0)
    for inc in (late, early):
        assert inc.rule == "cross_layer:no-cause" and inc.component is Component.COMMUNICATION
        assert inc.confidence < 0.5 and inc.blast_radius.nodes == ("n1", "n2")


def test_xid48_is_a_memory_error_and_xid13_an_application_fault():
    mem = diagnose_comm_failure(
        symptoms_on_every_rank(),
        from_kernel_log(read_kernel_log_file(DERIVED / "xid48_kmsg" / "kmsg.txt"), "n1", T0 - 99.1),
        now=T0,
    )
    assert mem.rule == "cross_layer:gpu-memory" and mem.component is Component.GPU_MEMORY
    app = diagnose_comm_failure(
        symptoms_on_every_rank(),
        from_kernel_log(read_kernel_log_file(DERIVED / "xid13_kmsg" / "kmsg.txt"), "n1", T0 - 99.1),
        now=T0,
    )
    assert app.rule == "cross_layer:application-xid" and app.fault_class is FaultClass.USER
    assert "Xid 13" in app.cause


@pytest.mark.parametrize(
    "fixture,rule,component",
    [
        ("burn_hw_thermal", "thermal-slowdown", Component.COOLING),
        ("burn_power_brake", "power-slowdown", Component.POWER),
        ("nvlink_errors", "nvlink", Component.NVLINK),
        ("remap_pending", "gpu-memory", Component.GPU_MEMORY),
        ("gpu_lost", "gpu-fell-off-bus", Component.GPU),
    ],
)
def test_recorded_h100_variants_name_their_cause(fixture, rule, component):
    findings = check_gpus(load_gpu_fixture(DERIVED / fixture), PassiveThresholds())
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_findings(findings, "n2", T0 - 60), now=T0)
    assert inc.rule == f"cross_layer:{rule}" and inc.component is component


def test_healthy_burn_under_full_load_explains_nothing():
    """SW power cap at ~1.3 GHz under load is normal: it must not become a cause."""
    findings = check_gpus(load_gpu_fixture(DERIVED / "healthy_burn"), PassiveThresholds())
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_findings(findings, "n2", T0 - 60), now=T0)
    assert inc.rule == "cross_layer:no-cause"


def test_ib_port_down_and_hung_mount():
    ib = Finding("infiniband", "ib.state", "mlx5_3/1", Severity.FAIL, "port state DOWN", {"state": "DOWN"})
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_findings([ib], "n1", T0 - 30), now=T0)
    assert inc.component is Component.IB_LINK and "mlx5_3/1" in inc.cause and inc.action == "route_around_hca"
    mount = Finding("mounts", "mount.hung", "/data", Severity.FAIL, "stat did not return within 2 s")
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_findings([mount], "n2", T0 - 30), now=T0)
    assert inc.component is Component.MOUNT and inc.fault_class is FaultClass.SYSTEM


def test_rule_order_is_priority_gpu_lost_beats_thermal():
    both = [
        Finding("gpu", "gpu.clock.hw_thermal", "gpu0", Severity.FAIL, "HW thermal"),
        Finding("gpu", "gpu.lost", "gpu1", Severity.FAIL, "GPU is lost"),
    ]
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_findings(both, "n1", T0 - 10), now=T0)
    assert inc.rule == "cross_layer:gpu-fell-off-bus" and "gpu1" in inc.cause


def test_non_comm_failure_is_not_a_symptom():
    crash = from_failure(
        FailureDetected(
            ts=T0,
            node="n1",
            rank=0,
            failure="crash",
            onset=T0,
            error_type="ValueError",
            error_message="bad shape",
            evidence="exit 1",
        )
    )
    assert crash.code == "process.crash"
    assert diagnose_comm_failure([crash], [], now=T0) is None


def test_nccl_ib_completion_error_names_the_hca():
    s = from_failure(
        FailureDetected(
            ts=T0,
            node="n1",
            rank=0,
            failure="peer_lost",
            onset=T0,
            evidence="",
            error_message="NET/IB: Got completion from peer 10.0.0.2<3421> with status=12 "
            "opcode=0 len=0 vendor_err=129 hca mlx5_3",
        )
    )
    assert s.code == "comm.error" and s.evidence["hca"] == "mlx5_3"


def test_incident_round_trips_through_the_ledger_encoding():
    klog = read_kernel_log_file(DERIVED / "xid79_kmsg" / "kmsg.txt")
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_kernel_log(klog, "n2", BOOT), now=T0, gpus=4)
    ev = inc.to_event(run_id="r1")
    back = decode(*encode(ev))
    assert isinstance(back, IncidentRaised) and back == ev
    assert back.component == "gpu" and back.nodes == ("n2",)


def test_bad_rule_file_is_one_clear_error(tmp_path):
    p = tmp_path / "rules.yaml"
    p.write_text(
        "rules:\n  - {name: x, match: [{code: gpu.xid}], cause: c, fault_class: cosmic, "
        "component: gpu, confidence: 0.5, action: a}\n"
    )
    with pytest.raises(ConfigError, match=r"rules\.0\.fault_class"):
        load_cross_rules(p)
    p.write_text("rules: []\n")
    with pytest.raises(ConfigError, match="rules"):
        load_cross_rules(p)


@pytest.mark.parametrize(
    "variant,rule,component",
    [
        ("xid74_kmsg", "nvlink", Component.NVLINK),
        ("xid94_kmsg", "gpu-memory", Component.GPU_MEMORY),
        ("xid48_kmsg", "gpu-memory", Component.GPU_MEMORY),
    ],
)
def test_kernel_log_variants_name_their_component(variant, rule, component):
    klog = read_kernel_log_file(DERIVED / variant / "kmsg.txt")
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_kernel_log(klog, "n1", T0 - 99.1), now=T0)
    assert inc.rule == f"cross_layer:{rule}" and inc.component is component
    assert inc.blast_radius.nodes == ("n1",) and inc.blast_radius.ranks == (0, 1)


def test_garbage_kernel_log_explains_nothing():
    klog = read_kernel_log_file(DERIVED / "garbage_kmsg" / "kmsg.txt")
    inc = diagnose_comm_failure(symptoms_on_every_rank(), from_kernel_log(klog, "n1", T0 - 1), now=T0)
    assert inc.rule == "cross_layer:no-cause"


def _peer_lost(node: str, rank: int, ts: float) -> Signal:
    return from_failure(
        FailureDetected(ts=ts + 1, node=node, rank=rank, failure="peer_lost", onset=ts, evidence="n1 left")
    )


def test_a_peer_lost_just_after_its_agent_excluded_it_is_the_exclusions_cascade():
    from stalwart.diagnose.pipeline import evidence_signals
    from stalwart.events import DecisionTaken

    def decision(action: str, ts: float) -> DecisionTaken:
        return DecisionTaken(ts=ts, node="n1", action=action, reason="exclude n1 and quarantine it: costs")

    symptoms = [_peer_lost("n0", 0, T0), _peer_lost("n0", 1, T0)]
    ev = evidence_signals([decision("exclude_quarantine", T0 - 10)])
    inc = diagnose_comm_failure(symptoms, ev, now=T0 + 5, gpus=4)
    assert inc is not None and inc.rule == "cross_layer:node-excluded", inc
    assert inc.component == Component.STRAGGLER and "n1" in inc.cause and "excluded" in inc.cause
    assert inc.blast_radius.nodes == ("n1",)
    # an observe-only record excluded nothing; an exclusion long before is not this failure's cause
    for late in (
        evidence_signals([decision("observe_exclude_quarantine", T0 - 10)]),
        evidence_signals([decision("exclude_quarantine", T0 - 600)]),
    ):
        inc = diagnose_comm_failure(symptoms, late, now=T0 + 5, gpus=4)
        assert inc is not None and inc.rule == "cross_layer:no-cause", inc


def test_a_peer_lost_just_after_its_agent_excluded_it_for_silent_corruption_is_that_cascade():
    from stalwart.diagnose.pipeline import evidence_signals  # deferred: as the straggler case above
    from stalwart.events import DecisionTaken  # deferred: as the straggler case above

    def decision(action: str) -> DecisionTaken:
        return DecisionTaken(
            ts=T0 - 5, node="n1", action=action, reason="n1 is quarantined for silent data corruption"
        )

    symptoms = [_peer_lost("n0", 0, T0), _peer_lost("n0", 1, T0)]
    inc = diagnose_comm_failure(symptoms, evidence_signals([decision("sdc_exclude")]), now=T0 + 5, gpus=4)
    assert inc is not None and inc.rule == "cross_layer:node-excluded-sdc", inc
    assert inc.component == Component.GPU and "silent data corruption" in inc.cause and "n1" in inc.cause
    # a quarantine that kept the node in the job excluded nothing
    kept = diagnose_comm_failure(symptoms, evidence_signals([decision("sdc_quarantine")]), now=T0 + 5, gpus=4)
    assert kept is not None and kept.rule == "cross_layer:no-cause", kept
