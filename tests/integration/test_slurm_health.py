"""Stalwart's health checks against a real Slurm controller with four slurmd nodes on this machine."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from netutil import free_port
from slurm_cluster import slurm_factory  # noqa: F401  (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"
GOOD = FIX / "h100"
BAD = FIX / "h100_derived" / "xid48_kmsg"  # recoverable: drain, reset, re-validate


def check(cluster, node: str, fixture: Path, state: Path, *extra: str):
    proc = cluster.run(
        sys.executable,
        "-m",
        "stalwart.cli",
        "health",
        "check",
        "--backend",
        "slurm",
        "--node",
        node,
        "--fixture",
        str(fixture),
        "--state-dir",
        str(state),
        "--json",
        *extra,
        check=False,
        timeout=180,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_drain_continue_resume_and_operator_drains_are_left_alone(slurm_factory, tmp_path):  # noqa: F811
    c = slurm_factory()
    state = tmp_path / "health"

    rc, out = check(c, "node2", BAD, state)
    assert rc == 1 and out["lifecycle"]["action"] == "drain"
    st, reason = c.nodes()["node2"]
    assert "drain" in st and reason.startswith("stalwart: ") and "Xid 48" in reason

    # the job runs on the rest: Slurm will not place work on the drained node
    ran = c.run("srun", "-N3", "bash", "-c", "echo $SLURMD_NODENAME").stdout.split()
    assert sorted(ran) == ["node1", "node3", "node4"]
    assert c.run("srun", "-N4", "--immediate=3", "true", check=False).returncode != 0

    # a passive pass is not re-validation: the node stays drained
    rc, out = check(c, "node2", GOOD, state)
    assert rc == 0 and out["lifecycle"]["state"] == "quarantined" and "drain" in c.nodes()["node2"][0]

    # the active suite passes -> resume (probation), read back from sinfo
    rc, out = check(c, "node2", GOOD, state, "--active")
    assert rc == 0 and out["lifecycle"]["action"] == "resume", out["lifecycle"]
    c.wait_for(lambda n: n["node2"][0] == "idle", what="node2 idle")
    assert c.nodes()["node2"][1] == ""
    assert sorted(c.run("srun", "-N4", "bash", "-c", "echo $SLURMD_NODENAME").stdout.split()) == [
        "node1",
        "node2",
        "node3",
        "node4",
    ]

    # cross-node all-reduce bus bandwidth: one process per Slurm node (all on this host here)
    port = free_port()
    probe = c.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        sys.executable,
        "-m",
        "stalwart.health.allreduce_probe",
        "--master",
        f"127.0.0.1:{port}",
        timeout=180,
    )
    res = json.loads(probe.stdout.strip().splitlines()[-1])
    assert res["ranks"] == 2 and res["ok"] and res["busbw_gbps"] > 0 and res["verdict"] == "pass"

    # an operator's drain is never resumed, and never overwritten by a failing check
    c.run("scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=maintenance: PSU swap")
    rc, out = check(c, "node3", GOOD, state, "--passive-readmit")
    assert rc == 0 and out["lifecycle"]["action"] == "none" and "not Stalwart's" in out["lifecycle"]["reason"]
    rc, out = check(c, "node3", BAD, state)
    assert rc == 1 and out["lifecycle"]["action"] == "none"
    st, reason = c.nodes()["node3"]
    assert "drain" in st and reason == "maintenance: PSU swap"

    listing = c.run(
        sys.executable,
        "-m",
        "stalwart.cli",
        "nodes",
        "--backend",
        "slurm",
        "--state-dir",
        str(state),
        "--json",
    )
    rows = {r["node"]: r for r in json.loads(listing.stdout)}
    assert rows["node2"]["state"] == "probation" and rows["node2"]["drained_by"] == "-"
    assert (
        rows["node3"]["drained_by"] == "operator"
        and rows["node3"]["scheduler_reason"] == "maintenance: PSU swap"
    )
    assert rows["node1"]["state"] == "unknown"  # listed by Slurm, never checked: not "healthy"


def test_health_check_program_drains_and_resumes_its_node(slurm_factory, tmp_path):  # noqa: F811
    hc = tmp_path / "hc"
    hc.mkdir()
    wrapper = hc / "stalwart-hc.sh"
    wrapper.write_text(f"""#!/bin/sh
# Slurm HealthCheckProgram: runs on every node with a minimal environment.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
# only node4 runs the real check here, to keep 2 CI cores free; on a cluster every node runs it
[ "$SLURMD_NODENAME" = node4 ] || exit 0
export SLURM_CONF="$(cat {hc}/slurm_conf_path)"
fix={GOOD}
[ -e {hc}/fault-$SLURMD_NODENAME ] && fix={BAD}
exec {sys.executable} -m stalwart.cli health check --backend slurm --node "$SLURMD_NODENAME" --fixture "$fix" \\
  --kernel-log '' --state-dir {hc}/state --passive-readmit >> {hc}/hc-$SLURMD_NODENAME.log 2>&1
""")
    os.chmod(wrapper, 0o755)
    (hc / "slurm_conf_path").write_text("/nonexistent")  # until the cluster is up
    c = slurm_factory(f"HealthCheckProgram={wrapper}\nHealthCheckInterval=3\nHealthCheckNodeState=ANY")
    (hc / "slurm_conf_path").write_text(str(c.conf))
    (hc / "fault-node4").touch()
    waited = c.wait_for(
        lambda n: "drain" in n["node4"][0] and n["node4"][1].startswith("stalwart: "),
        timeout=120,
        what="HealthCheckProgram drains node4",
    )
    assert all(c.nodes()[n][0] == "idle" for n in ("node1", "node2", "node3"))
    st_reason = c.nodes()["node4"][1]
    assert "Xid 48" in st_reason
    (hc / "fault-node4").unlink()
    back = c.wait_for(lambda n: n["node4"][0] == "idle", timeout=120, what="HealthCheckProgram resumes node4")
    print(f"HealthCheckProgram: drained after {waited:.1f} s, resumed after {back:.1f} s")
    # Slurm shows the node idle as soon as the check resumed it; the check prints its line only after
    # reading the state back (sinfo, slow on a busy machine): wait, bounded, for the line itself.
    # The CLI wraps at 80 columns, so the log is read with its line breaks folded into spaces.
    deadline = time.monotonic() + 60
    log = ""
    while "resume: re-validation passed" not in log and time.monotonic() < deadline:
        time.sleep(0.2)
        log = " ".join((hc / "hc-node4.log").read_text().split())
    assert (
        "node node4: quarantined -- drain: fail: Xid 48" in log and "resume: re-validation passed" in log
    ), log


def test_prolog_failure_drains_and_keeps_stalwarts_reason(slurm_factory, tmp_path):  # noqa: F811
    """Prolog exit 1 -> Slurm drains the node ("Prolog error"); with --backend slurm our reason stays."""
    script = tmp_path / "prolog.sh"
    conf_file = tmp_path / "slurm_conf_path"
    script.write_text(f"""#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF="$(cat {conf_file})"
case "$SLURMD_NODENAME" in
  node3) mode="";;
  node4) mode="--backend slurm";;
  *) exit 0;;
esac
exec {sys.executable} -m stalwart.cli health check $mode --node "$SLURMD_NODENAME" --fixture {BAD} \\
  --kernel-log '' --state-dir {tmp_path}/state >> {tmp_path}/prolog-$SLURMD_NODENAME.log 2>&1
""")
    os.chmod(script, 0o755)
    c = slurm_factory(f"Prolog={script}\nPrologFlags=Alloc")
    conf_file.write_text(str(c.conf))
    for node in ("node3", "node4"):
        p = c.run("srun", "-N1", "-w", node, "--immediate=30", "true", check=False, timeout=120)
        assert p.returncode != 0 and "Prolog failure" in p.stderr
    c.wait_for(lambda n: "drain" in n["node3"][0] and "drain" in n["node4"][0], what="prolog drains")
    nodes = c.nodes()
    assert nodes["node3"][1] == "Prolog error"  # Slurm's own drain: not Stalwart's, never auto-resumed
    assert nodes["node4"][1].startswith("stalwart: fail: Xid 48")
    assert nodes["node1"][0] == "idle" and nodes["node2"][0] == "idle"
