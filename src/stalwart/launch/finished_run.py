"""A finished run stays finished: what a re-run of a run that already succeeded is told (pure); the
script's fingerprint that makes a changed script bad input is in settings/script_fingerprint.py.

Re-running the identical command of a run whose newest verdict is ``succeeded`` launches nothing: it
says when the run finished, at which step, and how to start a new one. A run that ended otherwise
(preempted, a crash budget spent, interrupted) is resumed as before: that is what a requeue is for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..events import Event, JobEnded, StepCompleted


@dataclass(frozen=True)
class FinishedRun:
    ended_at: float
    final_step: int  # the newest step completed (-1: none observed)
    verdict: str

    def message(self, run_id: str, run_dir: Path) -> str:
        when = datetime.fromtimestamp(self.ended_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        step = f" at step {self.final_step}" if self.final_step >= 0 else ""
        return (
            f"run {run_id} already finished{step} on {when} ({self.verdict}); nothing launched. "
            f"To train again start a new run: give another --run-id, or --run-dir (this one: {run_dir})"
        )


def last_step(events: Iterable[Event]) -> int:
    """The highest step any rank completed (-1: none) (pure)."""
    return max((e.step for e in events if isinstance(e, StepCompleted)), default=-1)


def finished(events: Iterable[Event]) -> FinishedRun | None:
    """The run's success when its newest verdict is ``succeeded``, else None (pure)."""
    last: JobEnded | None = None
    top = -1
    for e in events:
        if isinstance(e, JobEnded) and (last is None or e.ts >= last.ts):
            last = e
        elif isinstance(e, StepCompleted):
            top = max(top, e.step)
    if last is None or last.outcome != "succeeded":
        return None
    return FinishedRun(last.ts, top, last.verdict)
