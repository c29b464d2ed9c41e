"""The sbatch template's own logic, run by bash with ``srun``, ``scontrol`` and ``stalwart`` replaced
(fast, no Slurm): what each node's agent is started with, and which exit codes requeue the job.
The template on a real Slurm cluster, agents killed and the job requeued: tests/e2e/test_slurm_sbatch.py.
The docs show it whole: a copy that differs from the shipped file fails here."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import stalwart.examples

pytestmark = pytest.mark.integration

TEMPLATE = Path(stalwart.examples.__file__).parent / "stalwart.sbatch"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "slurm.md"
NODES = ("node7", "node8")

# srun: run the command once per node, one after the other, with the task's variables; exit with the
# highest exit code, as srun does (a task killed by a signal counts as 128 + the signal)
FAKE_SRUN = """#!/bin/bash
while [ "${1#--}" != "$1" ]; do echo "$1" >> "$FAKE/srun-options"; shift; done
worst=0; id=0
for node in $FAKE_NODES; do
  SLURM_NODEID=$id SLURMD_NODENAME=$node "$@"; rc=$?
  [ $rc -gt $worst ] && worst=$rc
  id=$((id + 1))
done
exit $worst
"""
FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show hostnames") for n in $FAKE_NODES; do echo $n; done ;;
  "show node") echo "NodeName=$3 Arch=x86_64 CoresPerSocket=1"
               echo "   NodeAddr=10.1.0.$((${3#node} - 6)) NodeHostName=$3 Version=22.05.8" ;;
  "requeue "*) echo "$2" >> "$FAKE/requeued" ;;
  *) exit 1 ;;
esac
"""
# stalwart: record the arguments (one a line), then end as the test says for this node
FAKE_STALWART = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE/argv.$SLURMD_NODENAME"
var=CODE_$SLURMD_NODENAME; code=${!var}
[ "$code" = killed ] && kill -9 $$
exit "$code"
"""


def _submit(tmp_path: Path, codes: tuple[str, str], restarts: int | None = None) -> tuple[int, str, Path]:
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("stalwart", FAKE_STALWART)):
        (fake / "bin" / name).write_text(text)
        (fake / "bin" / name).chmod(0o755)
    env = {
        "PATH": f"{fake / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE": str(fake),
        "FAKE_NODES": " ".join(NODES),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[7-8]",
        "SLURM_JOB_NUM_NODES": "2",
        "NPROC_PER_NODE": "2",
        **{f"CODE_{n}": c for n, c in zip(NODES, codes, strict=True)},
    }
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    p = subprocess.run(
        ["bash", str(TEMPLATE), "train.py", "--name", "two words"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return p.returncode, p.stdout + p.stderr, fake


def test_each_node_runs_one_agent_against_the_first_nodes_address(tmp_path):
    code, out, fake = _submit(tmp_path, ("0", "0"))
    assert code == 0, out
    assert (fake / "srun-options").read_text().split() == ["--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    run_dir = tmp_path / "stalwart-runs" / "slurm-42"
    for i, node in enumerate(NODES):
        argv = (fake / f"argv.{node}").read_text().splitlines()
        assert argv == [
            "run",
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--rdzv-endpoint",
            "10.1.0.1:29400",  # node7's NodeAddr, not its name
            "--rdzv-id",
            "slurm-42",
            "--rdzv-host" if i == 0 else "--no-rdzv-host",  # the first node hosts the store
            "--node-name",
            node,
            "--run-dir",
            str(run_dir),
            "--health-backend",
            "slurm",
            "train.py",
            "--name",
            "two words",
        ]
    exits = run_dir / "slurm-exits" / "42.0"
    assert {p.name: p.read_text().strip() for p in exits.iterdir()} == {"node7": "0", "node8": "0"}
    assert oct(exits.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize(
    ("codes", "restarts", "verdict", "requeued"),
    [
        (("0", "0"), None, 0, False),
        (("0", "killed"), None, 0, False),  # the survivor finished at a smaller size
        (("killed", "75"), None, 75, True),  # the store's host killed: the survivor's verdict is 75
        (("76", "76"), 2, 76, True),  # preempted (SIGUSR1 before the time limit)
        (("3", "3"), None, 3, False),  # user error
        (("75", "3"), None, 3, False),  # a user error on any node: a requeue would fail the same way
        (("2", "2"), None, 2, False),
        (("75", "75"), 5, 75, False),  # MAX_REQUEUES (5) used up
        (("killed", "killed"), None, 137, False),  # no verdict from any agent: srun's exit code
    ],
)
def test_the_job_is_requeued_only_when_the_verdict_says_a_requeue_helps(
    tmp_path, codes, restarts, verdict, requeued
):
    code, out, fake = _submit(tmp_path, codes, restarts)
    assert code == verdict, out
    assert (fake / "requeued").exists() == requeued, out
    if requeued:
        assert (fake / "requeued").read_text().split() == ["42"]
        assert "stalwart: requeueing job 42" in out
    assert re.search(rf"^stalwart: agents exited with .*: verdict {verdict}$", out, flags=re.M), out


def test_the_docs_show_the_shipped_template():
    blocks = re.findall(r"^```bash\n(.*?)^```", DOCS.read_text(), flags=re.S | re.M)
    scripts = [b for b in blocks if b.startswith("#!")]
    assert scripts == [TEMPLATE.read_text()], (
        "docs/slurm.md must show src/stalwart/examples/stalwart.sbatch whole, as it is: copy the file "
        "into the page's ```bash block"
    )
