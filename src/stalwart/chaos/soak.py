"""Soak: many runs of a real job under randomized fault plans, each checked against a clean run.

A soak *run* is a chain of jobs that share one run directory: the same ``stalwart run`` command
launched again after every exit a scheduler would requeue (75, 76) or after the harness killed
the agent, exactly as ``sbatch --requeue`` would. Faults come from two places:

* inside: the project's own chaos plan (``--chaos``): crash, exit, hang, kill-agent,
  corrupt-checkpoint, truncate-checkpoint;
* outside: done by this harness to the live processes and files: SIGKILL of a worker, SIGSTOP of
  a worker, SIGKILL of the agent followed by a requeue, SIGTERM followed by a requeue, a full
  checkpoint disk (a real tmpfs, filled) during the run, at its end or during the emergency save,
  and, between jobs, a deleted, truncated or corrupted checkpoint file or manifest and a
  corrupted side ledger.

What is counted for every run (``RunResult``) and summed (``SoakSummary``): faults by kind that
actually fired, runs, bit-identical ends, wrong resumes (a job that did not resume from the newest
good checkpoint on disk when it started), committed good versions lost (a verified version that
vanished or went bad while fewer than ``keep`` newer versions are held (good ones, and ones the
run's chaos damaged on purpose, which retention keeps like any other), and the harness did not
damage it), false verdicts (exit 76 without a committed emergency checkpoint; exit 0 without a
committed good checkpoint of the final step; a crash of the tool itself), and tool hangs (a job
that outlived its time limit).

The harness judges only from outside: exit codes, files on disk and the ledger. Checkpoint
versions are judged good with the same ``verify`` the engine uses.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ..events import ChaosInjected
from .soak_files import (
    damage_between,
    free_filler,
    kill_tree,
    live_fault,
    mount_tmpfs,
    same_params,
    unmount,
)
from .soak_plan import (
    BETWEEN,
    INSIDE,
    KINDS,
    LIVE,
    REQUEUE_CODES,
    REQUEUERS,
    PlannedFault,
    SoakConfig,
    SoakFault,
    Venue,
    draw_plan,
)
from .soak_verdict import (
    JobSeen,
    RunResult,
    SoakSummary,
    check_job,
    good_versions,
    max_step,
    read_events,
    summarize,
)

__all__ = [
    "BETWEEN",
    "INSIDE",
    "KINDS",
    "LIVE",
    "REQUEUERS",
    "REQUEUE_CODES",
    "PlannedFault",
    "RunResult",
    "Soak",
    "SoakConfig",
    "SoakFault",
    "SoakSummary",
    "Venue",
    "draw_plan",
    "good_versions",
    "read_events",
    "summarize",
]

_JOB = ["-m", "stalwart.examples.charlm", "--corpus-bytes", "300000", "--log-every", "0"]


class Soak:
    def __init__(self, cfg: SoakConfig, *, log: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.log = log
        self.cfg.workdir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(cfg.seed)

    def command(self, run_dir: Path, out: Path, chaos: list[str]) -> list[str]:
        c = self.cfg
        return [
            c.python,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--no-report",
            "--redirects",
            "3",
            "--startup-timeout",
            "60",  # also the bound on a rank silent in a checkpoint (a SIGSTOP can land there)
            "--nproc-per-node",
            str(c.nproc),
            "--hang-floor",
            str(c.hang_floor_s),
            "--max-restarts",
            "8",
            "--stop-grace",
            "1",
            "--emergency-deadline",
            "20",
            "--run-dir",
            str(run_dir),
            *[f"--chaos={x}" for x in chaos],
            *_JOB,
            "--steps",
            str(c.steps),
            "--checkpoint-every",
            str(c.every),
            "--out",
            str(out),
        ]

    def reference(self) -> Path:
        ref = self.cfg.workdir / "ref.pt"
        if not ref.exists():
            p = subprocess.run(
                self.command(self.cfg.workdir / "ref", ref, []),
                capture_output=True,
                text=True,
                timeout=self.cfg.job_timeout_s,
            )
            if p.returncode != 0 or not ref.exists():
                raise RuntimeError(
                    f"the clean reference run failed (exit {p.returncode}): {p.stderr[-2000:]}"
                )
        return ref

    def run_all(self, progress: Callable[[SoakSummary], None] | None = None) -> SoakSummary:
        """Every run; ``progress`` gets the summary so far after each one (a long soak cut short
        still leaves its figures)."""
        ref = self.reference()
        results = []
        for i in range(self.cfg.runs):
            plan = draw_plan(self.rng, self.cfg)
            self.log(f"soak run {i + 1}/{self.cfg.runs}: " + ", ".join(f"{f.kind}@{f.step}" for f in plan))
            res = self.run_one(i, plan, ref)
            self.log(
                f"  -> jobs {res.jobs}, exits {res.exit_codes}, identical {res.bit_identical}, "
                f"fired {dict(res.fired)}, "
                f"problems {res.wrong_resumes + res.lost_versions + res.false_verdicts}"
            )
            results.append(res)
            if progress is not None:
                progress(summarize(results))
        return summarize(results)

    # one run: a chain of jobs -------------------------------------------------------------

    def run_one(self, index: int, plan: tuple[PlannedFault, ...], ref: Path) -> RunResult:
        c = self.cfg
        res = RunResult(index, plan)
        base = c.workdir / f"run-{index:03d}"
        if base.exists():
            unmount(base / "run" / "checkpoints")
            shutil.rmtree(base)
        run_dir, out = base / "run", base / "out.pt"
        (run_dir / "checkpoints").mkdir(parents=True)
        disk = next((f for f in plan if f.kind.fills_disk), None)
        if disk is not None and not mount_tmpfs(run_dir / "checkpoints", c.tmpfs_bytes):
            res.notes.append("full-disk faults skipped: cannot mount a tmpfs (needs root)")
            plan = tuple(f for f in plan if f is not disk)
            res.plan = plan
        try:
            self._chain(run_dir, out, plan, res)
            if res.exit_codes and res.exit_codes[-1] == 0:
                res.bit_identical = out.exists() and same_params(ref, out)
                if not res.bit_identical:
                    res.notes.append("final parameters differ from the clean run")
        finally:
            unmount(run_dir / "checkpoints")
        return res

    def _chain(self, run_dir: Path, out: Path, plan: tuple[PlannedFault, ...], res: RunResult) -> None:
        """The jobs of one run: the same command again after every exit a scheduler would requeue."""
        c = self.cfg
        inside = [f.flag() for f in plan if f.kind.venue is Venue.INSIDE]
        live = [f for f in plan if f.kind.venue is Venue.LIVE]
        between = [f for f in plan if f.kind.venue is Venue.BETWEEN]
        damaged: set[int] = set()
        for job in range(c.max_jobs):
            before = good_versions(run_dir / "checkpoints")
            started = time.time()
            code, hung = self._job(run_dir, out, inside, live, res, job)
            res.jobs += 1
            res.exit_codes.append(code)
            if hung:
                res.tool_hangs += 1
                return
            seen = JobSeen(job, started, code, before, good_versions(run_dir / "checkpoints"))
            check_job(run_dir, seen, keep=c.keep, steps=c.steps, every=c.every, damaged=damaged, res=res)
            # count this job's faults now: a side ledger damaged before the next job loses them
            res.fired.update(
                str(ev.fault)
                for ev in read_events(run_dir)
                if isinstance(ev, ChaosInjected) and ev.ts >= started
            )
            if code not in REQUEUE_CODES and code != -signal.SIGKILL:
                return
            if between:  # damage files between jobs, as a failing node or a user might
                f = between.pop(0)
                fired, hit = damage_between(f.kind, run_dir, self.rng)
                if fired:
                    res.fired[f.kind.value] += 1
                if hit is not None:
                    damaged.add(hit)
            free_filler(run_dir / "checkpoints")

    def _job(
        self, run_dir: Path, out: Path, inside: list[str], live: list[PlannedFault], res: RunResult, job: int
    ) -> tuple[int, bool]:
        """One job of the chain; performs the live faults due in it. Returns (exit code, timed out)."""
        c = self.cfg
        t0 = time.monotonic()
        proc = subprocess.Popen(
            self.command(run_dir, out, inside),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        pending = list(live)
        freed_at: float | None = None
        while proc.poll() is None:
            if time.monotonic() - t0 > c.job_timeout_s:
                kill_tree(proc)
                res.notes.append(f"job {job} exceeded {c.job_timeout_s:.0f}s")
                return proc.wait(), True
            if pending:
                freed_at = self._due_live_faults(pending, live, proc, run_dir, res, freed_at)
            if freed_at is not None and time.monotonic() >= freed_at:
                free_filler(run_dir / "checkpoints")
                freed_at = None
            time.sleep(0.3)
        _, stderr = proc.communicate()
        # the agent's own traceback (worker output goes to files: --redirects 3)
        if any(ln.startswith("Traceback (most recent call last)") for ln in stderr.splitlines()):
            res.false_verdicts.append(
                f"job {job}: the tool crashed (exit {proc.returncode}): "
                f"{stderr.strip().splitlines()[-1][:200]}"
            )
        return proc.returncode, False

    def _due_live_faults(
        self,
        pending: list[PlannedFault],
        live: list[PlannedFault],
        proc: subprocess.Popen[str],
        run_dir: Path,
        res: RunResult,
        freed_at: float | None,
    ) -> float | None:
        """Do the live faults whose step the job reached; return when a filled disk is to be freed."""
        step = max_step(run_dir)
        for f in [f for f in pending if step >= f.step]:
            pending.remove(f)
            live.remove(f)
            if not live_fault(f, proc, run_dir):
                continue
            res.fired[f.kind.value] += 1
            if f.kind is SoakFault.FULL_DISK:
                freed_at = time.monotonic() + 3.0
            elif f.kind is SoakFault.FULL_DISK_END:
                freed_at = None  # stays full: the run must not claim success
        return freed_at
