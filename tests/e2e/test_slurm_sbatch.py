"""The sbatch template (src/stalwart/examples/stalwart.sbatch, shown whole in docs/slurm.md) on a real
Slurm cluster: slurmctld and four slurmd on this machine (tests/slurm_cluster.py).

One job of two nodes, one worker each (tests/e2e/sdk_scripts/inplace_ddp.py under Session.run), meets
both things a lost agent can mean under srun:

1. the agent of the first node, which hosts the c10d rendezvous store, is SIGKILLed once a checkpoint
   is on the shared run directory. When that agent also led the round (group rank 0: on one machine
   the lower pid), the other agent's restart finds no store and it ends at once; otherwise it shrinks
   the group in place and trains on, but only until the store has been silent for the store timeout
   (60 s by default, 10 s here, so that it comes before this short run could end alone). Either way
   its verdict is exit 75, the template requeues the job (``scontrol requeue``), and the requeued job
   (same job id, ``SLURM_RESTART_COUNT=1``) resumes from the newest checkpoint;
2. in the requeued job the agent of the second node is SIGKILLed: the survivor goes on without it (in
   place, or by a restart of the group when the lost agent led the round) and trains to the last
   step alone; the template sees one agent finish (exit 0) and does not requeue.

The job ends COMPLETED with exit 0 after one requeue, and ``stalwart report --json`` on the run
directory says every step was trained, over two jobs. The test touches only processes of its own job
(their environment names this cluster's configuration and the job id), cancels the job on every exit
path and waits for its processes to end before the fixture stops the cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

import stalwart
import stalwart.examples
from netutil import free_port
from slurm_cluster import SlurmCluster, slurm_factory  # noqa: F401  (fixture)
from stalwart.checkpoint.manifest import MANIFEST
from stalwart.checkpoint.store import step_name
from stalwart.events import CheckpointCommitted, DecisionTaken, JobEnded, StepCompleted, TrainingResumed

from .runner import events, events_so_far
from .runner import stalwart as run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

TEMPLATE = Path(stalwart.examples.__file__).parent / "stalwart.sbatch"
SCRIPT = Path(__file__).parent / "sdk_scripts" / "inplace_ddp.py"
SRC = Path(stalwart.__file__).resolve().parents[1]
STEPS = 500  # at least 0.05 s each: time to act on what the ledger shows, and for the store timeout
STORE_TIMEOUT_S = 10  # the survivor of the store's host ends 75 this long after it (default 60 s)
T = TypeVar("T")
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


def _until(what: str, probe: Callable[[], T | None], timeout: float, job: Job) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got is not None:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{job.describe()}")


class Job:
    """One submitted job: its state in Slurm, its agents and its output."""

    def __init__(self, cluster: SlurmCluster, tmp: Path, env: dict[str, str]) -> None:
        self.cluster, self.tmp, self.env = cluster, tmp, env
        self.run_dir = Path(env["RUN_DIR"])
        p = subprocess.run(
            ["sbatch", "--parsable", "-D", str(tmp), "-o", str(tmp / "job-%j.out"), str(TEMPLATE)]
            + [str(SCRIPT), str(STEPS), str(tmp / "out")],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert p.returncode == 0, p.stderr
        self.id = p.stdout.strip().split(";")[0]

    def fields(self) -> dict[str, str]:
        out = self.cluster.run("scontrol", "show", "job", self.id, "-o", check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def agents(self) -> dict[str, int]:
        """SLURM_NODEID -> pid of each live agent of this job, found by the ledger each agent names
        after its node and pid, and checked to be this job's by its environment."""
        found = {}
        for ledger in (self.run_dir / "ledger").glob("agent-*-*.ledger"):
            pid = int(ledger.stem.rsplit("-", 1)[1])
            env = _environ(pid)
            if env.get("SLURM_JOB_ID") == self.id and env.get("SLURM_CONF") == str(self.cluster.conf):
                found[env["SLURM_NODEID"]] = pid
        return found

    def processes(self) -> list[int]:
        """Every process still running for this job (its tasks and their children)."""
        return [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit()
            and (env := _environ(int(p.name))).get("SLURM_JOB_ID") == self.id
            and env.get("SLURM_CONF") == str(self.cluster.conf)
        ]

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob("job-*.out")))

    def describe(self) -> str:
        return f"job {self.id}: {self.fields().get('JobState')}\n--- job output\n{self.output()[-6000:]}"

    def end(self) -> None:
        """Cancel the job if it still runs, and wait (bounded) until its processes are gone; kill any
        left over, so none outlives the cluster."""
        if self.fields().get("JobState") not in TERMINAL:
            self.cluster.run("scancel", self.id, check=False)
        deadline = time.monotonic() + 60
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _exits(run_dir: Path, job: str, restart: int) -> list[str]:
    d = run_dir / "slurm-exits" / f"{job}.{restart}"
    return sorted(p.read_text().strip() for p in d.iterdir()) if d.is_dir() else []


@pytest.mark.timeout(900)
def test_sbatch_template_requeues_on_a_lost_store_host_and_the_survivor_finishes_a_lost_node(
    slurm_factory,  # noqa: F811
    tmp_path,
):
    t_start = time.monotonic()
    cluster = slurm_factory()
    bindir = tmp_path / "bin"  # `stalwart` on the job's PATH: this checkout's, under this interpreter
    bindir.mkdir()
    (bindir / "stalwart").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m stalwart.cli "$@"\n')
    (bindir / "stalwart").chmod(0o755)
    run_dir = tmp_path / "run"
    env = {
        **cluster.env,
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "RUN_DIR": str(run_dir),
        "NPROC_PER_NODE": "1",
        "RDZV_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "INPLACE_DROPOUT": "0",
        "STALWART_RDZV_READ_TIMEOUT_S": str(STORE_TIMEOUT_S),  # the agents' setting, from the environment
    }
    (tmp_path / "out").mkdir()
    job = Job(cluster, tmp_path, env)
    try:
        # 1. both agents train; once a checkpoint is on the shared run directory, kill the first node's
        stored = run_dir / "checkpoints"

        def saved() -> int | None:
            steps = [
                c.step for c in events_so_far(run_dir, CheckpointCommitted) if Path(c.path).parent == stored
            ]
            return max(steps) if steps and len(job.agents()) == 2 else None

        saved_step = _until("a checkpoint on the run directory", saved, 300, job)
        head = job.agents()["0"]
        t_kill1 = time.time()
        os.kill(head, signal.SIGKILL)

        # the other agent's verdict is 75 and the template requeues the job
        _until("the requeue", lambda: job.fields().get("Restarts") == "1" or None, 180, job)
        t_requeued = time.time()
        assert _exits(run_dir, job.id, 0) == ["137", "75"], job.describe()
        assert f"stalwart: requeueing job {job.id}" in job.output()

        # 2. the requeued job resumes from the checkpoint; once it trains, kill the second node's agent
        def resumed() -> TrainingResumed | None:  # not the survivor's in place ("live:") in the first job
            return next((e for e in events_so_far(run_dir, TrainingResumed) if e.ts > t_requeued), None)

        first = _until("the requeued job's resume", resumed, 300, job)

        def training() -> int | None:
            agents = job.agents()
            later = [e for e in events_so_far(run_dir, StepCompleted) if e.ts > first.ts]
            return (
                agents.get("1") if len(agents) == 2 and any(e.step >= first.step + 5 for e in later) else None
            )

        other = _until("the requeued job training on two nodes", training, 300, job)
        lost = _environ(other)["SLURMD_NODENAME"]
        t_kill2 = time.time()
        os.kill(other, signal.SIGKILL)

        # the survivor trains to the end alone; the template sees it finish and does not requeue
        def ended() -> dict[str, str] | None:  # or requeued once more, which fails below at once
            f = job.fields()
            return f if f.get("JobState") in TERMINAL or f.get("Restarts", "1") != "1" else None

        state = _until("the job's end", ended, 300, job)
        t_end = time.time()
        assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", "0:0", "1"), (
            job.describe()
        )
        assert _exits(run_dir, job.id, 1) == ["0", "137"], job.describe()
    finally:
        job.end()

    assert 0 < first.step and first.step >= saved_step, (first, saved_step)
    durable = {c.step for c in events(run_dir, CheckpointCommitted) if Path(c.path).parent == stored}
    # a checkpoint of the run directory, not a fresh start: one the ledger says committed, or one whose
    # writer (rank 0, on the node killed first) renamed it into place and was killed before it wrote the
    # ledger's line (CI run 13); the directory holds its manifest only once whole
    whole = (stored / step_name(first.step) / MANIFEST).is_file()
    assert first.step in durable or whole, (first, sorted(durable))
    last = {e.node for e in events(run_dir, StepCompleted) if e.step == STEPS - 1}
    assert len(last) == 1 and lost not in last, (lost, last)  # the last step: the survivor alone
    report = run_cli("report", str(run_dir), "--json", timeout=120)
    assert report.code == 0, report.err
    got = json.loads(report.out)
    assert (got["outcome"], got["exit_code"], got["steps_completed"]) == ("succeeded", 0, STEPS), got
    assert got["jobs"] == 2 and got["buckets_s"]["queue"] > 0, (got["jobs"], got["buckets_s"])
    [(_, why, code)] = [
        (e.ts, e.outcome, e.exit_code) for e in events(run_dir, JobEnded) if e.ts < t_requeued
    ]
    assert code == 75, why  # the store host's survivor
    decided = events(run_dir, DecisionTaken)
    taken = [e.action for e in decided if e.ts > t_kill2]
    taken1 = [e.action for e in decided if t_kill1 < e.ts < t_requeued]
    print(
        f"e2e slurm sbatch: {time.monotonic() - t_start:.0f} s in all; first job: checkpoint at step "
        f"{saved_step}, its survivor did {taken1} and ended {why}; requeued {t_requeued - t_kill1:.1f} s after the kill, "
        f"resumed at step {first.step} {first.ts - t_requeued:.1f} s later; after the second kill "
        f"{taken}, world changes {got['world_changes']}, the job ended {t_end - t_kill2:.1f} s later"
    )
