"""`stalwart health check` and `stalwart nodes` as real processes: exit codes, JSON, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stalwart.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_recorded_h100_passes_with_a_table():
    p = cli("health", "check", "--fixture", str(FIX / "h100"), "--expected-gpus", "1")
    assert p.returncode == 0, p.stderr
    assert "GPUs on" in p.stdout and "H100" in p.stdout and "pass: no findings" in p.stdout


def test_fault_exits_one_for_slurm_prolog_and_json_names_it():
    p = cli("health", "check", "--fixture", str(FIX / "h100_derived" / "xid79_kmsg"), "--json")
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert out["passed"] is False and out["verdict"]["action"] == "drain_power_cycle"
    assert out["verdict"]["recoverable"] is False
    xids = [f for f in out["findings"] if f["code"] == "gpu.xid"]
    assert xids[0]["evidence"]["xid"] == 79 and xids[0]["subject"] == "gpu0"
    assert out["gpu"]["gpus"][0]["bus_id"] == "00000000:00:06.0"


def test_this_machine_without_gpu_passes_and_says_so():
    p = cli("health", "check", "--json", "--kernel-log", "")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    if not out["gpu"]["available"]:
        assert "no NVIDIA GPU driver" in out["verdict"]["reason"]


def test_active_suite_on_cpu():
    p = cli("health", "check", "--active", "--json", "--kernel-log", "")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    codes = {f["code"] for f in out["findings"]}
    assert {"active.gemm", "active.membw", "active.allreduce", "active.disk", "active.train_step"} <= codes
    assert out["timings"]["active"] > 0
    # the suite takes seconds: each test is announced as it starts and ends (stdout stays JSON)
    for name in ("gemm", "mem_bw", "allreduce", "disk_write", "train_step"):
        assert f"stalwart: active: {name} ..." in p.stderr and f"stalwart: active: {name} done in" in p.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--fixture", "/nonexistent/telemetry"], "fixture directory /nonexistent/telemetry does not exist"),
        (["--backend", "k8s"], "unknown backend 'k8s'"),
        (["--expected-gpus", "-1"], "invalid health check option --expected-gpus"),
    ],
)
def test_usage_errors_are_one_line_exit_two(args, needle):
    p = cli("health", "check", *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr


def test_bad_rule_table_is_a_one_line_error(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules: [{code: x, verdict: sometimes, action: y}]")
    p = cli("health", "check", "--fixture", str(FIX / "h100"), "--rules", str(bad))
    assert p.returncode == 2 and "verdict 'sometimes'" in p.stderr and "Traceback" not in p.stderr


def test_local_backend_lifecycle_and_nodes_listing(tmp_path):
    state = tmp_path / "health"
    p = cli(
        "health",
        "check",
        "--fixture",
        str(FIX / "h100_derived" / "remap_pending"),
        "--backend",
        "local",
        "--node",
        "gpu-a",
        "--state-dir",
        str(state),
        "--json",
    )
    assert p.returncode == 1 and json.loads(p.stdout)["lifecycle"]["state"] == "quarantined"
    p = cli(
        "health",
        "check",
        "--fixture",
        str(FIX / "h100"),
        "--backend",
        "local",
        "--node",
        "gpu-b",
        "--state-dir",
        str(state),
    )
    assert p.returncode == 0
    p = cli("nodes", "--state-dir", str(state), "--json")
    rows = {r["node"]: r for r in json.loads(p.stdout)}
    assert rows["gpu-a"]["state"] == "quarantined" and "remap pending" in rows["gpu-a"]["reason"]
    assert "gpu-b" not in rows or rows["gpu-b"]["state"] == "healthy"
    p = cli("nodes", "--state-dir", str(state))
    assert "gpu-a" in p.stdout and "quarantined" in p.stdout
