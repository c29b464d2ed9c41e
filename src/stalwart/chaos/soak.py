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

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint.store import step_name
from ..events import ChaosInjected

INSIDE = ("crash", "exit", "hang", "kill-agent", "corrupt-checkpoint", "truncate-checkpoint")
LIVE = (
    "sigkill-worker",
    "sigstop-worker",
    "sigkill-agent",
    "sigterm-requeue",
    "full-disk",
    "full-disk-emergency",
    "full-disk-end",
)
BETWEEN = ("delete-ckpt-file", "truncate-ckpt-file", "corrupt-manifest", "corrupt-ledger")
KINDS = INSIDE + LIVE + BETWEEN
REQUEUE_CODES = (75, 76)
REQUEUERS = ("kill-agent", "sigkill-agent", "sigterm-requeue", "full-disk-emergency")
_JOB = ["-m", "stalwart.examples.charlm", "--corpus-bytes", "300000", "--log-every", "0"]


@dataclass(frozen=True)
class SoakConfig:
    workdir: Path
    runs: int = 4
    nproc: int = 2
    steps: int = 24
    every: int = 4
    keep: int = 3
    seed: int = 0
    faults_per_run: tuple[int, int] = (1, 3)
    job_timeout_s: float = 240.0
    max_jobs: int = 6
    hang_floor_s: float = 2.0
    tmpfs_bytes: int = 12 << 20  # room for keep + 2 versions of the example (1.7 MB each)
    python: str = sys.executable


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    step: int
    rank: int = 0

    def flag(self) -> str:
        if self.kind == "kill-agent":
            return f"kill-agent@node=0,step={self.step}"
        if self.kind in ("corrupt-checkpoint", "truncate-checkpoint"):
            return f"{self.kind}@step={self.step}"
        return f"{self.kind}@rank={self.rank},step={self.step}"


@dataclass
class RunResult:
    index: int
    plan: tuple[PlannedFault, ...]
    fired: Counter = field(default_factory=Counter)
    jobs: int = 0
    exit_codes: list[int] = field(default_factory=list)
    bit_identical: bool | None = None
    wrong_resumes: list[str] = field(default_factory=list)
    lost_versions: list[str] = field(default_factory=list)
    false_verdicts: list[str] = field(default_factory=list)
    tool_hangs: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SoakSummary:
    runs: int
    faults: dict[str, int]
    finished: int
    bit_identical: int
    not_identical: int
    wrong_resumes: int
    versions_lost: int
    false_verdicts: int
    tool_hangs: int
    details: tuple[str, ...]

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())

    @property
    def clean(self) -> bool:
        return not (
            self.not_identical
            or self.wrong_resumes
            or self.versions_lost
            or self.false_verdicts
            or self.tool_hangs
        )

    def to_json(self) -> str:
        data = {
            k: getattr(self, k)
            for k in (
                "runs",
                "faults",
                "finished",
                "bit_identical",
                "not_identical",
                "wrong_resumes",
                "versions_lost",
                "false_verdicts",
                "tool_hangs",
            )
        }
        data["total_faults"] = self.total_faults
        data["details"] = list(self.details)
        return json.dumps(data, indent=1, sort_keys=True)


# --- planning (pure) ---------------------------------------------------------------------------


def draw_plan(rng: random.Random, cfg: SoakConfig) -> tuple[PlannedFault, ...]:
    """A random plan of 1..n faults of distinct kinds, at steps spread over the run."""
    n = rng.randint(*cfg.faults_per_run)
    kinds = rng.sample(KINDS, n)
    # at most one full-disk variant and one fault that ends the job from outside per run, so the
    # checks stay attributable
    disk = [k for k in kinds if k.startswith("full-disk")]
    kinds = [k for k in kinds if not k.startswith("full-disk")] + disk[:1]
    if any(k in BETWEEN for k in kinds) and not any(k in REQUEUERS for k in kinds):
        kinds.append(rng.choice(("sigkill-agent", "sigterm-requeue")))  # damage between jobs needs a requeue
    plan = []
    for k in kinds:
        if k == "full-disk-end":
            step = cfg.steps - cfg.every - 1  # the last two saves (the final one included) hit a full disk
        else:
            step = rng.randint(cfg.every + 1, cfg.steps - 3)
        plan.append(PlannedFault(k, step, rng.randrange(cfg.nproc)))
    return tuple(sorted(plan, key=lambda f: f.step))


# --- reading what is on disk -----------------------------------------------------------------


def good_versions(ckpt_dir: Path) -> dict[int, Path]:
    """Committed versions that verify, by step."""
    from ..checkpoint.manifest import verify
    from ..checkpoint.store import FileStore

    out = {}
    for step, path in FileStore(ckpt_dir).versions():
        try:
            manifest, _ = verify(path)
        except Exception:  # noqa: BLE001 - a version the verifier cannot even read is not good
            manifest = None
        if manifest is not None:
            out[step] = path
    return out


def read_events(run_dir: Path) -> list:
    """Every event of every readable ledger file (the harness corrupts some on purpose)."""
    from ..errors import LedgerError
    from ..ledger import read_available

    try:
        return sorted(read_available(run_dir, require_some=False).events, key=lambda e: e.ts)
    except LedgerError:  # no ledger yet
        return []


def _max_step(run_dir: Path) -> int:
    from ..events import StepCompleted

    steps = [e.step for e in read_events(run_dir) if isinstance(e, StepCompleted)]
    return max(steps, default=-1)


# --- the harness ------------------------------------------------------------------------------


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
            _unmount(base / "run" / "checkpoints")
            shutil.rmtree(base)
        run_dir, out = base / "run", base / "out.pt"
        (run_dir / "checkpoints").mkdir(parents=True)
        disk = next((f for f in plan if f.kind.startswith("full-disk")), None)
        if disk is not None and not _mount_tmpfs(run_dir / "checkpoints", c.tmpfs_bytes):
            res.notes.append("full-disk faults skipped: cannot mount a tmpfs (needs root)")
            plan = tuple(f for f in plan if f is not disk)
            res.plan, disk = plan, None
        inside = [f.flag() for f in plan if f.kind in INSIDE]
        live = [f for f in plan if f.kind in LIVE]
        between = [f for f in plan if f.kind in BETWEEN]
        try:
            damaged: set[int] = set()
            for job in range(c.max_jobs):
                before = good_versions(run_dir / "checkpoints")
                started = time.time()
                code, hung = self._job(run_dir, out, inside, live, res, job)
                res.jobs += 1
                res.exit_codes.append(code)
                if hung:
                    res.tool_hangs += 1
                    break
                after = good_versions(run_dir / "checkpoints")
                self._check_job(run_dir, job, started, code, before, after, damaged, res)
                # count this job's faults now: a side ledger damaged before the next job loses them
                res.fired.update(
                    ev.fault
                    for ev in read_events(run_dir)
                    if isinstance(ev, ChaosInjected) and ev.ts >= started
                )
                if code in REQUEUE_CODES or code == -signal.SIGKILL:
                    if between:  # damage files between jobs, as a failing node or a user might
                        f = between.pop(0)
                        fired, hit = _damage_between(f.kind, run_dir, self.rng)
                        if fired:
                            res.fired[f.kind] += 1
                        if hit is not None:
                            damaged.add(hit)
                    _free_filler(run_dir / "checkpoints")
                    continue
                break
            if res.exit_codes and res.exit_codes[-1] == 0:
                res.bit_identical = out.exists() and _same_params(ref, out)
                if not res.bit_identical:
                    res.notes.append("final parameters differ from the clean run")
        finally:
            _unmount(run_dir / "checkpoints")
        return res

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
                _kill_tree(proc)
                res.notes.append(f"job {job} exceeded {c.job_timeout_s:.0f}s")
                return proc.wait(), True
            if pending:
                step = _max_step(run_dir)
                due = [f for f in pending if step >= f.step]
                for f in due:
                    pending.remove(f)
                    live.remove(f)
                    if self._live_fault(f, proc, run_dir):
                        res.fired[f.kind] += 1
                        if f.kind in ("full-disk", "full-disk-end"):
                            freed_at = time.monotonic() + (3.0 if f.kind == "full-disk" else 0.0)
                            if f.kind == "full-disk-end":
                                freed_at = None  # stays full: the run must not claim success
            if freed_at is not None and time.monotonic() >= freed_at:
                _free_filler(run_dir / "checkpoints")
                freed_at = None
            time.sleep(0.3)
        stdout, stderr = proc.communicate()
        # the agent's own traceback (worker output goes to files: --redirects 3)
        if any(ln.startswith("Traceback (most recent call last)") for ln in stderr.splitlines()):
            res.false_verdicts.append(
                f"job {job}: the tool crashed (exit {proc.returncode}): "
                f"{stderr.strip().splitlines()[-1][:200]}"
            )
        return proc.returncode, False

    def _live_fault(self, f: PlannedFault, proc: subprocess.Popen, run_dir: Path) -> bool:
        workers = _children(proc.pid)
        if f.kind in ("sigkill-worker", "sigstop-worker"):
            if not workers:
                return False
            pid = workers[f.rank % len(workers)]
            os.kill(pid, signal.SIGKILL if f.kind == "sigkill-worker" else signal.SIGSTOP)
            return True
        if f.kind == "sigkill-agent":
            os.killpg(proc.pid, signal.SIGKILL)  # the agent and its workers, as a lost node
            return True
        if f.kind == "sigterm-requeue":
            proc.send_signal(signal.SIGTERM)
            return True
        if f.kind.startswith("full-disk"):
            _fill(run_dir / "checkpoints")
            if f.kind == "full-disk-emergency":
                proc.send_signal(signal.SIGTERM)
            return True
        return False

    # judging ------------------------------------------------------------------------------

    def _check_job(
        self,
        run_dir: Path,
        job: int,
        started: float,
        code: int,
        before: dict[int, Path],
        after: dict[int, Path],
        damaged: set[int],
        res: RunResult,
    ) -> None:
        from ..events import JobEnded, TrainingResumed

        evs = [e for e in read_events(run_dir) if e.ts >= started]
        for e in evs:  # versions the job's own chaos damaged on purpose are not "lost"
            if isinstance(e, ChaosInjected) and (m := re.search(r"step-(\d+)", e.detail)):
                damaged.add(int(m.group(1)))
        this_job = next((e for e in reversed(evs) if isinstance(e, JobEnded)), None)
        if job > 0:
            first = next((e for e in evs if isinstance(e, TrainingResumed)), None)
            expect = max(before, default=0)
            if first is not None and first.step != expect:
                res.wrong_resumes.append(
                    f"job {job} resumed from step {first.step}, newest good on disk was {expect}"
                )
        # retention keeps the newest `keep` versions on disk, good or not: a version this run's chaos
        # damaged on purpose still holds a slot, so an older good one may rightly be deleted for it
        held = {s for s in damaged if (run_dir / "checkpoints" / step_name(s)).is_dir()}
        newer = sorted(set(after) | held, reverse=True)
        for step in before:
            if step in after or step in damaged:
                continue
            if len([s for s in newer if s > step]) < self.cfg.keep:
                res.lost_versions.append(f"good version step {step} vanished or went bad during job {job}")
        if code == 76:  # the verdict names the step it saved; that step must verify on disk
            m = re.search(
                r"emergency checkpoint of step (\d+) committed", this_job.verdict if this_job else ""
            )
            if m is None or int(m.group(1)) not in after:
                res.false_verdicts.append(
                    f"job {job}: exit 76 (preempted, saved) but the step it names has no good checkpoint "
                    f"({this_job.verdict if this_job else 'no verdict in the ledger'})"
                )
        # the final version is owed unless this run's own chaos damaged it after it committed (the
        # agent's damage aims at the newest version when it is due, which can be the final one)
        if code == 0 and self.cfg.every and self.cfg.steps not in after and self.cfg.steps not in damaged:
            res.false_verdicts.append(
                f"job {job}: exit 0 but the final step {self.cfg.steps} has no good "
                f"checkpoint (newest good: {max(after, default=None)})"
            )
        if this_job is not None and code >= 0 and this_job.exit_code != code:
            res.false_verdicts.append(
                f"job {job}: ledger verdict exit {this_job.exit_code} but process exit {code}"
            )


def summarize(results: list[RunResult]) -> SoakSummary:
    faults: Counter = Counter()
    details = []
    for r in results:
        faults.update(r.fired)
        for what in (*r.wrong_resumes, *r.lost_versions, *r.false_verdicts, *r.notes):
            details.append(f"run {r.index}: {what}")
    finished = [r for r in results if r.exit_codes and r.exit_codes[-1] == 0]
    return SoakSummary(
        runs=len(results),
        faults=dict(sorted(faults.items())),
        finished=len(finished),
        bit_identical=sum(1 for r in finished if r.bit_identical),
        not_identical=sum(1 for r in finished if r.bit_identical is False),
        wrong_resumes=sum(len(r.wrong_resumes) for r in results),
        versions_lost=sum(len(r.lost_versions) for r in results),
        false_verdicts=sum(len(r.false_verdicts) for r in results),
        tool_hangs=sum(r.tool_hangs for r in results),
        details=tuple(details),
    )


# --- process and file helpers ----------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return sorted(int(x) for x in text.split())


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _same_params(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _mount_tmpfs(path: Path, size: int) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def _unmount(path: Path) -> None:
    if path.exists() and os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


_FILLER = ".soak-filler"


def _fill(path: Path) -> None:
    """Fill the filesystem under ``path`` to the last byte."""
    try:
        with open(path / _FILLER, "wb") as fh:
            block = b"\0" * (64 << 10)
            while True:
                fh.write(block)
                fh.flush()
    except OSError:
        pass


def _free_filler(path: Path) -> None:
    (path / _FILLER).unlink(missing_ok=True)


def _damage_between(kind: str, run_dir: Path, rng: random.Random) -> tuple[bool, int | None]:
    """Damage the newest committed checkpoint (or a side ledger) between jobs; return whether
    something was damaged and the checkpoint step hit (None for a ledger)."""
    if kind == "corrupt-ledger":
        files = sorted((run_dir / "ledger").glob("worker-*.ledger"))
        if not files:
            return False, None
        victim = rng.choice(files)
        with open(victim, "r+b") as fh:
            fh.seek(0)
            fh.write(b"garbage, not a sqlite database" * 8)
        return True, None
    versions = good_versions(run_dir / "checkpoints")
    if not versions:
        return False, None
    step = max(versions)
    path = versions[step]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name != "MANIFEST.json")
    if kind == "corrupt-manifest":
        (path / "MANIFEST.json").write_text(rng.choice(["null", "[]", '{"files": []}', "{not json"]))
    elif kind == "delete-ckpt-file" and files:
        rng.choice(files).unlink()
    elif kind == "truncate-ckpt-file" and files:
        victim = rng.choice(files)
        with open(victim, "r+b") as fh:
            fh.truncate(max(0, victim.stat().st_size // 2))
    else:
        return False, None
    return True, step
