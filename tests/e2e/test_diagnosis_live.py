"""Issue 14's live acceptance runs: real ``stalwart run`` processes, the diagnosis collector in the
agent, injected node and facility evidence; the incidents must name the real cause, once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.events import DecisionTaken, FailureDetected, IncidentRaised

from .runner import console, events, stalwart, wait_listening

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "sectioned.py")
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def test_a_slow_rank_on_a_hot_gpu_on_a_warming_loop_is_one_cooling_seam_with_cost(tmp_path):
    now = time.time()
    tele = tmp_path / "telemetry"  # the node's GPU: HW thermal slowdown in the last minute
    shutil.copytree(FIX / "h100_derived" / "burn_hw_thermal", tele)
    for f in tele.iterdir():  # the recording just ended (the copy kept the fixture's old mtimes)
        os.utime(f, (now, now))
    fac = tmp_path / "facility.csv"  # loop A's inlet rises from 24 C to ~33 C over ten minutes
    rows = [f"{now - 600 + 20 * i:.0f},loopA,inlet_temp_c,{24 + 0.3 * i:.1f}" for i in range(31 + 30)] + [
        f"{now - 600 + 20 * i:.0f},loopB,inlet_temp_c,24.0" for i in range(61)
    ]
    fac.write_text("ts,loop,metric,value\n" + "\n".join(rows) + "\n")
    topo = tmp_path / "topology.yaml"
    topo.write_text(
        "nodes:\n  n0: {rack: r1, leaf_switch: sw1, pdu: p1, cooling_loop: loopA}\n"
        "  n9: {rack: r2, leaf_switch: sw2, pdu: p2, cooling_loop: loopB}\n"
    )
    rd = tmp_path / "run"
    run = stalwart(
        "run",
        "--no-health-gate",
        "--nproc-per-node",
        "2",
        "--node-name",
        "n0",
        "--run-dir",
        str(rd),
        "--topology",
        str(topo),
        "--facility",
        str(fac),
        "--node-telemetry",
        str(tele),
        "--chaos",
        "slow@rank=1,factor=3,from=5",
        SCRIPT,
        "40",
        timeout=400,
    )
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    incidents = events(rd, IncidentRaised)
    assert [i.rule for i in incidents] == ["seam:cooling-loop"], [i.cause for i in incidents]
    seam = incidents[0]
    assert seam.domain == "cooling_loop:loopA" and seam.ranks == (1,)
    assert seam.fault_class == "facility" and seam.action == "facility_alert_no_rma"
    assert seam.cost_gpu_s > 0
    said = console(run.out)
    assert "incident" in said and "cooling seam: loop loopA" in said  # the console line


def test_a_comm_timeout_with_xid79_on_its_node_is_a_gpu_off_the_bus_incident(tmp_path):
    klog = tmp_path / "kmsg.txt"  # written as dmesg would: seconds since boot, now
    klog.write_text(
        f"[{_uptime():.6f}] NVRM: Xid (PCI:0000:00:06): 79, pid=4242, name=python, GPU has fallen off the bus.\n"
    )
    rd = tmp_path / "run"
    run = stalwart(
        "run",
        "--no-health-gate",
        "--nproc-per-node",
        "2",
        "--node-name",
        "n0",
        "--max-restarts",
        "0",
        "--run-dir",
        str(rd),
        "--kernel-log",
        str(klog),
        SCRIPT,
        "20",
        "1",
        timeout=400,
    )
    assert run.code != 0, run.out[-3000:]
    failures = events(rd, FailureDetected)
    assert failures and "Watchdog caught collective operation timeout" in failures[0].evidence
    incidents = events(rd, IncidentRaised)
    assert [i.rule for i in incidents] == ["cross_layer:gpu-fell-off-bus"], [i.cause for i in incidents]
    inc = incidents[0]
    assert inc.component == "gpu" and inc.fault_class == "hardware" and inc.action == "drain_power_cycle"
    assert "fell off the bus" in inc.cause and inc.nodes == ("n0",) and 1 in inc.ranks
    assert any("Xid (PCI:0000:00:06): 79" in line for line in inc.evidence)
    assert "fell off the bus" in console(run.out)


def _ib_down(root: Path) -> Path:
    """Node telemetry: the recorded H100 snapshot plus one InfiniBand port that went down."""
    root.mkdir(parents=True)
    shutil.copy(FIX / "h100" / "nvml_snapshot.json", root / "nvml_snapshot.json")
    port = root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for name, value in {
        "state": "1: DOWN",
        "phys_state": "3: Disabled",
        "rate": "400 Gb/sec (4X NDR)",
        "link_layer": "InfiniBand",
    }.items():
        (port / name).write_text(value + "\n")
    return root


def test_a_comm_failure_beside_a_down_ib_port_restarts_routed_around_it(tmp_path):
    """Issue 14, route around a sick link: the restart leaves the HCA out through NCCL_IB_HCA, the
    incident and a decision say so, and the node is flagged for repair without leaving the job."""
    rd, seen = tmp_path / "run", tmp_path / "nccl-env.txt"
    run = stalwart(  # the health gate is on (this machine has no InfiniBand, so it passes)
        "run",
        "--nproc-per-node",
        "2",
        "--node-name",
        "n0",
        "--max-restarts",
        "1",
        "--run-dir",
        str(rd),
        "--node-telemetry",
        str(_ib_down(tmp_path / "tele")),
        SCRIPT,
        "20",
        "1",
        str(seen),
        timeout=400,
    )
    assert run.code == 0, run.out[-3000:]
    assert seen.read_text().splitlines() == ["0 -", "1 ^=mlx5_0:1"], "attempt 1 runs without the sick HCA"
    (inc,) = [i for i in events(rd, IncidentRaised) if i.rule == "cross_layer:ib-link"]
    assert inc.component == "ib_link" and inc.action == "route_around_hca" and inc.nodes == ("n0",)
    assert inc.env == {"NCCL_IB_HCA": "^=mlx5_0:1"} and "next attempt routes around mlx5_0/1" in inc.cause
    (dec,) = [d for d in events(rd, DecisionTaken) if d.action == "route_around_hca"]
    assert dec.attempt == 1 and "NCCL_IB_HCA=^=mlx5_0:1" in dec.reason and "suspect" in dec.reason
    nodes = stalwart("nodes", "--state-dir", str(rd / "health"), "--json")
    assert nodes.code == 0, nodes.err
    (rec,) = [r for r in json.loads(nodes.out) if r["node"] == "n0"]
    assert rec["state"] == "suspect" and "routed around" in rec["reason"], rec


def test_faults_on_three_nodes_under_one_leaf_switch_are_one_shared_cause_and_no_mass_drain(tmp_path):
    topo = tmp_path / "topology.csv"
    topo.write_text(
        "node,rack,leaf_switch,pdu,cooling_loop\nn1,r1,sw1,p1,l1\nn2,r1,sw1,p2,l1\nn3,r2,sw1,p3,l2\n"
        "n4,r2,sw2,p4,l2\n"
    )
    rd, port = tmp_path / "run", free_port()
    procs = []
    for i, node in enumerate(("n1", "n2", "n3")):
        cmd = [
            sys.executable,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--no-health-gate",
            "--nnodes",
            "3",
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "0",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "diag-shared",
            "--run-dir",
            str(rd),
            "--node-name",
            node,
            "--topology",
            str(topo),
            "--node-telemetry",
            str(_ib_down(tmp_path / f"tele-{node}")),
            SCRIPT,
            "20",
            "all",
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        if i == 0:
            wait_listening(port, procs[0])  # n1 hosts the rendezvous store
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs), outs
    incidents = events(rd, IncidentRaised)
    shared = [i for i in incidents if i.rule.startswith("seam:shared")]
    assert [i.rule for i in shared] == ["seam:shared-leaf_switch"], [i.cause for i in incidents]
    assert shared[0].domain == "leaf_switch:sw1" and shared[0].action == "page_oncall_no_mass_drain"
    assert "3 of 3 nodes under leaf switch sw1" in shared[0].cause
    per_node = sorted(i.nodes[0] for i in incidents if i.rule == "cross_layer:ib-link")
    assert per_node == ["n1", "n2", "n3"], [i.cause for i in incidents]
    drains = [d for d in events(rd, DecisionTaken) if d.action in ("drain", "exclude_node", "quarantine")]
    assert drains == [], "no node was drained"
