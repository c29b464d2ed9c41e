"""How the soak judges a run, from outside only: exit codes, files on disk and the ledger.

Per run (:class:`RunResult`): faults by kind that fired, jobs, exit codes, whether the end is
bit-identical to the clean run, wrong resumes, committed good versions lost, false verdicts and tool
hangs; summed over runs (:class:`SoakSummary`). Checkpoint versions are judged good with the same
``verify`` the engine uses.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint.manifest import verify
from ..checkpoint.store import FileStore, step_name
from ..errors import LedgerError
from ..events import ChaosInjected, Event, JobEnded, StepCompleted, TrainingResumed
from ..ledger import read_available
from .soak_plan import PlannedFault


@dataclass
class RunResult:
    index: int
    plan: tuple[PlannedFault, ...]
    fired: Counter[str] = field(default_factory=Counter)
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


def summarize(results: list[RunResult]) -> SoakSummary:
    faults: Counter[str] = Counter()
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


# --- reading what is on disk -----------------------------------------------------------------


def good_versions(ckpt_dir: Path) -> dict[int, Path]:
    """Committed versions that verify, by step."""

    out = {}
    for step, path in FileStore(ckpt_dir).versions():
        try:
            manifest, _ = verify(path)
        except Exception:  # noqa: BLE001 - a version the verifier cannot even read is not good
            manifest = None
        if manifest is not None:
            out[step] = path
    return out


def read_events(run_dir: Path) -> list[Event]:
    """Every event of every readable ledger file (the harness corrupts some on purpose)."""

    try:
        return sorted(read_available(run_dir, require_some=False).events, key=lambda e: e.ts)
    except LedgerError:  # no ledger yet
        return []


def max_step(run_dir: Path) -> int:
    steps = [e.step for e in read_events(run_dir) if isinstance(e, StepCompleted)]
    return max(steps, default=-1)


# --- judging one job -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSeen:
    """One job of a run's chain as the harness saw it from outside."""

    job: int
    started: float  # wall time the job was launched (its ledger events are not older)
    code: int  # its exit code
    before: dict[int, Path]  # good versions on disk when it started
    after: dict[int, Path]  # good versions on disk when it ended


def check_job(
    run_dir: Path, seen: JobSeen, *, keep: int, steps: int, every: int, damaged: set[int], res: RunResult
) -> None:
    """Add to ``res`` what one job did wrong; ``damaged`` (updated) holds the version steps this
    run's chaos damaged on purpose, which are never counted as lost."""
    evs = [e for e in read_events(run_dir) if e.ts >= seen.started]
    for e in evs:  # versions the job's own chaos damaged on purpose are not "lost"
        if isinstance(e, ChaosInjected) and (m := re.search(r"step-(\d+)", e.detail)):
            damaged.add(int(m.group(1)))
    this_job = next((e for e in reversed(evs) if isinstance(e, JobEnded)), None)
    if seen.job > 0:
        _check_resume(evs, seen, res)
    _check_lost(run_dir, seen, keep, damaged, res)
    _check_verdict(this_job, seen, steps=steps, every=every, damaged=damaged, res=res)


def _check_resume(evs: list[Event], seen: JobSeen, res: RunResult) -> None:
    first = next((e for e in evs if isinstance(e, TrainingResumed)), None)
    expect = max(seen.before, default=0)
    if first is not None and first.step != expect:
        res.wrong_resumes.append(
            f"job {seen.job} resumed from step {first.step}, newest good on disk was {expect}"
        )


def _check_lost(run_dir: Path, seen: JobSeen, keep: int, damaged: set[int], res: RunResult) -> None:
    # retention keeps the newest `keep` versions on disk, good or not: a version this run's chaos
    # damaged on purpose still holds a slot, so an older good one may rightly be deleted for it
    held = {s for s in damaged if (run_dir / "checkpoints" / step_name(s)).is_dir()}
    newer = sorted(set(seen.after) | held, reverse=True)
    for step in seen.before:
        if step in seen.after or step in damaged:
            continue
        if len([s for s in newer if s > step]) < keep:
            res.lost_versions.append(f"good version step {step} vanished or went bad during job {seen.job}")


def _check_verdict(
    this_job: JobEnded | None, seen: JobSeen, *, steps: int, every: int, damaged: set[int], res: RunResult
) -> None:
    job, code, after = seen.job, seen.code, seen.after
    verdict = this_job.verdict if this_job else ""
    if code == 76:  # the verdict names the step it saved; that step must verify on disk
        m = re.search(r"emergency checkpoint of step (\d+) committed", verdict)
        if m is None or int(m.group(1)) not in after:
            res.false_verdicts.append(
                f"job {job}: exit 76 (preempted, saved) but the step it names has no good checkpoint "
                f"({verdict if this_job else 'no verdict in the ledger'})"
            )
    # the final version is owed unless this run's own chaos damaged it after it committed (the
    # agent's damage aims at the newest version when it is due, which can be the final one)
    if code == 0 and every and steps not in after and steps not in damaged:
        res.false_verdicts.append(
            f"job {job}: exit 0 but the final step {steps} has no good "
            f"checkpoint (newest good: {max(after, default=None)})"
        )
    if this_job is not None and code >= 0 and this_job.exit_code != code:
        res.false_verdicts.append(
            f"job {job}: ledger verdict exit {this_job.exit_code} but process exit {code}"
        )
