"""The live diagnosis collector: ledger events + this node's evidence -> each incident raised once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from stalwart.diagnose.live import LedgerTail, LiveDiagnosis, LiveSources, parse_queries, validate_sources
from stalwart.errors import ConfigError
from stalwart.events import AttemptStarted, FailureDetected, IncidentRaised, StepCompleted, StragglerDetected
from stalwart.ledger import LedgerWriter, read_merged
from stalwart.protocol.run_dir import RunDir

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
T0 = 1_700_000_000.0
BOOT = T0 - 1000.0  # the node booted 1000 s before T0


def ctx(node: str = "n1", attempt: int = 0) -> dict:
    return {"run_id": "r", "node": node, "attempt": attempt}


def write(run: RunDir, events, name: str = "agent-n1-1") -> None:
    with LedgerWriter(run.ledger / f"{name}.ledger", writer="test") as w:
        for e in events:
            w.append(e)


def comm_failure(node: str = "n1", rank: int = 1, ts: float = T0) -> FailureDetected:
    return FailureDetected(
        ts=ts,
        onset=ts - 0.5,
        rank=rank,
        failure="user_error",
        evidence="rank failed",
        error_type="torch.distributed.DistBackendError",
        error_message="Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE) timed out",
        **ctx(node),
    )


def live(run: RunDir, node: str = "n1", now: float = T0 + 5, **src) -> LiveDiagnosis:
    return LiveDiagnosis(run, node, "r", LiveSources(**src), clock=lambda: now, uptime=lambda: now - BOOT)


def test_comm_timeout_with_xid79_is_one_fell_off_bus_incident_raised_once(tmp_path):
    run = RunDir(tmp_path / "run").create()
    write(run, [AttemptStarted(ts=T0 - 60, world_size=2, **ctx()), comm_failure()])
    klog = tmp_path / "kmsg.txt"
    klog.write_text("[  995.000000] NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n")
    shown = []
    d = live(run, kernel_log=klog)
    d.notify = shown.append
    new = d.poll(T0 + 5)
    assert [e.rule for e in new] == ["cross_layer:gpu-fell-off-bus"]
    assert "fell off the bus" in new[0].cause and "NCCL" not in new[0].cause.split(";")[0]
    assert new[0].onset == pytest.approx(BOOT + 995.0)  # the kernel-log line, in wall time
    assert shown == list(new)
    assert d.poll(T0 + 7) == ()  # the same incident is not raised again
    other = live(run, kernel_log=klog)  # another agent sharing the run directory
    assert other.poll(T0 + 8) == ()
    d.stop()
    raised = [e for e in read_merged(run.root) if isinstance(e, IncidentRaised)]
    assert len(raised) == 1 and raised[0].node == "n1"


def test_unexplained_failure_waits_for_another_agents_explanation(tmp_path):
    run = RunDir(tmp_path / "run").create()
    write(run, [AttemptStarted(ts=T0 - 60, world_size=2, **ctx()), comm_failure()])
    d = live(run)
    assert d.poll(T0 + 1) == ()  # within the grace: another node may hold the cause
    assert [e.rule for e in d.poll(T0 + 30)] == ["cross_layer:no-cause"]


def test_no_cause_is_not_raised_when_another_agent_explained_it(tmp_path):
    run = RunDir(tmp_path / "run").create()
    write(run, [AttemptStarted(ts=T0 - 60, world_size=2, **ctx()), comm_failure()])
    klog = tmp_path / "kmsg.txt"
    klog.write_text("[  999.000000] NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n")
    assert len(live(run, node="n1", kernel_log=klog).poll(T0 + 2)) == 1
    assert live(run, node="n2").poll(T0 + 60) == ()


@pytest.mark.parametrize("recorded_ago, rules", [(100, ["seam:cooling-loop"]), (5000, [])])
def test_slow_rank_thermal_gpu_and_rising_inlet_is_one_cooling_seam_with_cost(tmp_path, recorded_ago, rules):
    run = RunDir(tmp_path / "run").create()
    write(
        run,
        [
            AttemptStarted(ts=T0 - 300, world_size=4, **ctx()),
            StragglerDetected(ts=T0 - 200, rank=1, score=1.6, step=40, evidence="rank 1 1.6x", **ctx()),
        ],
    )
    tele = tmp_path / "tele"
    shutil.copytree(FIX / "h100_derived" / "burn_hw_thermal", tele)
    for f in tele.iterdir():  # the recording ended this long before now (older: outside the window)
        os.utime(f, (T0 - recorded_ago, T0 - recorded_ago))
    fac = tmp_path / "facility.csv"
    rows = [f"{T0 - 600 + 30 * i:.0f},loopA,inlet_temp_c,{24 + 0.5 * i:.1f}" for i in range(21)]
    fac.write_text("ts,loop,metric,value\n" + "\n".join(rows) + "\n")
    topo = tmp_path / "topo.yaml"
    topo.write_text("nodes:\n  n1: {leaf_switch: sw1, cooling_loop: loopA}\n  n2: {cooling_loop: loopA}\n")
    d = live(run, now=T0, topology=topo, facility=str(fac), node_telemetry=tele)
    new = d.poll(T0)
    assert [e.rule for e in new] == rules
    if not rules:
        return
    assert new[0].domain == "cooling_loop:loopA" and new[0].cost_gpu_s > 0
    assert new[0].ranks == (1,)
    assert d.poll(T0 + 2) == ()


def test_three_faulty_nodes_under_one_switch_are_one_shared_cause_held_not_drained(tmp_path):
    run = RunDir(tmp_path / "run").create()
    node_incidents = [
        IncidentRaised(
            ts=T0 + i,
            onset=T0 + i,
            cause=f"InfiniBand port mlx5_0/1 on n{i} is down",
            fault_class="hardware",
            component="ib_link",
            confidence=0.85,
            action="route_around_hca",
            rule="cross_layer:ib-link",
            nodes=(f"n{i}",),
            **ctx(f"n{i}"),
        )
        for i in (1, 2, 3)
    ]
    write(run, [AttemptStarted(ts=T0 - 60, world_size=3, **ctx()), *node_incidents])
    topo = tmp_path / "topo.csv"
    topo.write_text("node,rack,leaf_switch,pdu,cooling_loop\nn1,r1,sw1,p1,\nn2,r1,sw1,p2,\nn3,r2,sw1,p3,\n")
    new = live(run, topology=topo).poll(T0 + 10)
    assert [e.rule for e in new] == ["seam:shared-leaf_switch"]
    assert new[0].action == "page_oncall_no_mass_drain"
    assert any("do not mass drain" in line for line in new[0].evidence)
    assert live(run, node="n2", topology=topo).poll(T0 + 11) == ()  # raised once across agents


def test_two_faulty_nodes_are_not_a_shared_cause(tmp_path):
    run = RunDir(tmp_path / "run").create()
    inc = [
        IncidentRaised(
            ts=T0 + i,
            onset=T0 + i,
            cause="x",
            fault_class="hardware",
            component="gpu",
            confidence=0.9,
            action="drain_power_cycle",
            rule="cross_layer:gpu-fell-off-bus",
            nodes=(f"n{i}",),
            **ctx(f"n{i}"),
        )
        for i in (1, 2)
    ]
    write(run, inc)
    topo = tmp_path / "topo.csv"
    topo.write_text("node,leaf_switch\nn1,sw1\nn2,sw1\nn3,sw1\n")
    assert live(run, topology=topo).poll(T0 + 10) == ()


def test_ledger_tail_reads_only_new_rows_and_skips_steps(tmp_path):
    run = RunDir(tmp_path / "run").create()
    w = LedgerWriter(run.ledger / "agent-n1-1.ledger", writer="test")
    w.append(AttemptStarted(ts=T0, world_size=1, **ctx()))
    w.append(StepCompleted(ts=T0, rank=0, step=0, start=T0, duration=0.1, **ctx()))
    tail = LedgerTail(run.ledger)
    assert [e.kind for e in tail.read()] == ["AttemptStarted"]
    w.append(comm_failure())
    assert [e.kind for e in tail.read()] == ["FailureDetected"]
    assert tail.read() == []
    w.close()


def test_bad_sources_are_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match="metric=PromQL"):
        parse_queries(["inlet_temp_c"])
    with pytest.raises(ConfigError, match="no --facility-query"):
        validate_sources(None, "http://prom:9090", [], None, None)
    with pytest.raises(ConfigError, match="no such file"):
        validate_sources(None, str(tmp_path / "missing.csv"), [], None, None)
    bad = tmp_path / "topo.yaml"
    bad.write_text("nodes: {n1: {switch: sw1}}\n")
    with pytest.raises(ConfigError):
        validate_sources(bad, "", [], None, None)


def test_a_facility_source_that_breaks_mid_run_is_one_collector_incident(tmp_path):
    run = RunDir(tmp_path / "run").create()
    write(run, [AttemptStarted(ts=T0 - 60, world_size=2, **ctx())])
    fac = tmp_path / "facility.csv"
    fac.write_text("ts,loop,metric,value\n")
    d = live(run, facility=str(fac))
    assert d.poll(T0) == ()
    fac.write_text("ts,loop,metric,value\n1,loopA,flux_capacitor,3\n")  # the exporter now writes junk
    new = d.poll(T0 + 2)
    assert [(e.rule, e.component) for e in new] == [("policy:collector-error", "collector")]
    assert "flux_capacitor" in new[0].cause and new[0].onset == T0 + 2
    assert d.poll(T0 + 4) == ()  # the same error is not raised again


def _ib_down(root: Path, mtime: float) -> Path:
    """Node telemetry recorded at ``mtime``: the H100 snapshot and InfiniBand port mlx5_0/1 down."""
    root.mkdir(parents=True)
    shutil.copy(FIX / "h100" / "nvml_snapshot.json", root / "nvml_snapshot.json")
    port = root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for name, value in {
        "state": "1: DOWN",
        "phys_state": "3: Disabled",
        "rate": "400 Gb/sec (4X NDR)",
    }.items():
        (port / name).write_text(value + "\n")
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, (mtime, mtime))
    return root


def test_a_comm_failure_beside_a_down_ib_port_routes_the_next_attempt_around_it_once(tmp_path, monkeypatch):
    monkeypatch.delenv("NCCL_IB_HCA", raising=False)
    run = RunDir(tmp_path / "run").create()
    write(run, [AttemptStarted(ts=T0 - 60, world_size=2, **ctx()), comm_failure()])
    d = live(run, node_telemetry=_ib_down(tmp_path / "tele", T0 - 30))
    assert d.route_env() == {}
    new = d.refresh()  # what the agent calls before a restart
    assert [e.rule for e in new] == ["cross_layer:ib-link"] and new[0].action == "route_around_hca"
    assert new[0].env == {"NCCL_IB_HCA": "^=mlx5_0:1"} and "routes around mlx5_0/1" in new[0].cause
    assert d.route_env() == {"NCCL_IB_HCA": "^=mlx5_0:1"}
    assert d.poll(T0 + 9) == () and d.route_env() == {"NCCL_IB_HCA": "^=mlx5_0:1"}  # decided once


def test_a_down_ib_port_that_is_the_jobs_only_hca_is_a_drain_not_a_route(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_IB_HCA", "=mlx5_0:1")  # the user pinned NCCL to that one port
    run = RunDir(tmp_path / "run").create()
    write(run, [AttemptStarted(ts=T0 - 60, world_size=2, **ctx()), comm_failure()])
    d = live(run, node_telemetry=_ib_down(tmp_path / "tele", T0 - 30))
    (inc,) = d.poll(T0 + 5)
    assert inc.rule == "cross_layer:ib-link" and inc.action == "drain_check_link" and inc.env == {}
    assert any("only HCA" in line for line in inc.evidence) and d.route_env() == {}


def test_this_nodes_down_ib_port_is_routed_around_when_the_failure_surfaced_on_a_peer(tmp_path, monkeypatch):
    monkeypatch.delenv("NCCL_IB_HCA", raising=False)
    run = RunDir(tmp_path / "run").create()
    write(run, [AttemptStarted(ts=T0 - 60, world_size=2, **ctx()), comm_failure(node="n2")])
    d = live(run, node="n1", node_telemetry=_ib_down(tmp_path / "tele", T0 - 30))
    (inc,) = d.poll(T0 + 5)
    assert inc.rule == "cross_layer:ib-link" and inc.nodes == ("n1",)  # the port is n1's, not n2's
    assert inc.env == {"NCCL_IB_HCA": "^=mlx5_0:1"} and d.route_env() == dict(inc.env)
