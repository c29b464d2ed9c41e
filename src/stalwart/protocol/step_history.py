"""Where an unchanged script really is: its step, learned from the parameters it holds.

A script without the SDK counts its own steps and loads its own checkpoints; the bootstrap's
optimizer step hooks only see steps go by. So after each step a rank appends the step's number and
a sampled fingerprint of its parameters (``stalwart.train.fingerprint``) to its history file in the run
directory (``steps/r<rank>.txt``, this user's only), and when a restarted process takes its first
step, the fingerprint of the state it starts from says where it resumed (:func:`resume_point`, pure):

* it matches the state after recorded step ``k``: the script resumed from its checkpoint of step
  ``k``, and this process's first step is ``k + 1``;
* it matches the recorded initial state, or there is no history (the run's first start): step 0;
* no match, but the optimizer's state carries a step count (Adam and its kin keep one per
  parameter): that count is the number of steps the loaded state had taken;
* no match, and the optimizer's state is new: a start from new parameters, step 0;
* otherwise the resume point is unknown, and the account says so instead of guessing.

The history file holds one short line per step (about 25 bytes); a restart reads it once.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

INITIAL = -1  # the step number the run's initial state is recorded under


class ResumeSource(enum.Enum):
    FIRST_START = "first start"  # no history: the run's first steps
    FINGERPRINT = "parameter fingerprint"  # the state matched a recorded step's (or the initial one)
    OPTIMIZER = "optimizer step count"  # the loaded optimizer state said how many steps it had taken
    NEW_STATE = "new state"  # new parameters and a new optimizer: started over from step 0
    UNKNOWN = "unknown"  # none of the above: the account says the resume point is not known


@dataclass(frozen=True)
class ResumePoint:
    step: int  # the first step this process runs, in the script's own numbering
    source: ResumeSource
    reason: str

    @property
    def label(self) -> str:
        """What ``TrainingResumed.from_checkpoint`` says of it: ``script:`` then how it is known."""
        return f"script:{self.source.name.lower()}: {self.reason}"


def resume_point(
    fp: str, history: Mapping[str, int], optimizer_steps: int | None, fresh_optimizer: bool
) -> ResumePoint:
    """The step a process whose parameters have fingerprint ``fp`` before its first step starts at
    (pure). ``history`` maps each recorded fingerprint to the newest step recorded with it
    (:data:`INITIAL` for the run's initial state)."""
    if not history:
        return ResumePoint(0, ResumeSource.FIRST_START, "the run's first start")
    if fp and fp in history:
        done = history[fp]
        if done == INITIAL:
            return ResumePoint(
                0, ResumeSource.FINGERPRINT, "from scratch: the parameters match the run's initial state"
            )
        return ResumePoint(
            done + 1,
            ResumeSource.FINGERPRINT,
            f"resumed at step {done + 1}: the parameters are those after step {done}",
        )
    if optimizer_steps is not None and optimizer_steps > 0:
        return ResumePoint(
            optimizer_steps,
            ResumeSource.OPTIMIZER,
            f"the loaded optimizer state had taken {optimizer_steps} steps",
        )
    if fresh_optimizer:
        return ResumePoint(
            0, ResumeSource.NEW_STATE, "from scratch: new parameters and a new optimizer state"
        )
    return ResumePoint(
        0,
        ResumeSource.UNKNOWN,
        "the parameters match no recorded step and the optimizer carries no step count",
    )


def parse(lines: Iterable[str]) -> dict[str, int]:
    """A history file's lines (``<step> <fingerprint>``) as fingerprint -> newest step; a torn or
    foreign line (a crash mid-write) is skipped."""
    out: dict[str, int] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not parts[0].lstrip("-").isdigit():
            continue
        out[parts[1]] = int(parts[0])
    return out


class StepHistory:
    """One rank's history file: read once at the first step, appended to after every step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out: IO[str] | None = None

    def read(self) -> dict[str, int]:
        try:
            with self.path.open(encoding="ascii", errors="replace") as f:
                return parse(f)
        except OSError:  # no history yet (or unreadable: then the resume point is only guessed)
            return {}

    def record(self, step: int, fp: str) -> None:
        """Append ``step``'s fingerprint (best effort: a full disk must not stop training)."""
        if not fp:
            return
        try:
            if self._out is None:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                self._out = os.fdopen(fd, "a", encoding="ascii")
            self._out.write(f"{step} {fp}\n")
            self._out.flush()
        except OSError:
            self._out = None

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


_SESSION_OWNS_STEPS = False  # a Session in this process counts the steps: the hooks' locator stands down


def session_owns_steps() -> bool:
    return _SESSION_OWNS_STEPS


def claim_steps() -> None:
    """A Session was made in this process: its own step numbers and resume events count, so the
    bootstrap's locator records and says nothing."""
    global _SESSION_OWNS_STEPS
    _SESSION_OWNS_STEPS = True


def release_steps() -> None:
    """No Session counts this process's steps (again): the hooks' locator records them. A process
    starts this way; a test that made a Session hands the steps back with this."""
    global _SESSION_OWNS_STEPS
    _SESSION_OWNS_STEPS = False


def optimizer_steps(optimizer: object) -> tuple[int | None, bool]:
    """The step count the optimizer's state carries (Adam and its kin keep one per parameter; None
    where it keeps none) and whether its state is new (nothing loaded or stepped yet)."""
    state = getattr(optimizer, "state", None)
    if not isinstance(state, Mapping) or not state:
        return None, True
    for per_param in state.values():
        count = per_param.get("step") if isinstance(per_param, Mapping) else None
        if count is not None:
            try:
                return int(count), False  # a tensor or a number
            except (TypeError, ValueError, RuntimeError):
                return None, False
    return None, False


def script_resume(label: str) -> tuple[ResumeSource, str] | None:
    """How and why an unchanged script resumed after a restart, read back from the
    ``TrainingResumed.from_checkpoint`` that :attr:`ResumePoint.label` wrote; None for any other label
    (an SDK checkpoint, live state) and for the script's first start."""
    if not label.startswith("script:"):
        return None
    name, _, reason = label.removeprefix("script:").partition(": ")
    source = next((s for s in ResumeSource if s.name.lower() == name), None)
    if source is None or source is ResumeSource.FIRST_START:
        return None
    return source, reason
