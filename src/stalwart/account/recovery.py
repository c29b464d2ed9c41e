"""Each interruption's recovery: the path taken (warm or cold, and why) and its phases, from the ledger.

Phases, in order (seconds; each from the end of the previous one):

* detect: fault onset -> FailureDetected
* tear down: -> the failed attempt's workers stopped (WorkersStopped)
* decide: -> the restart decision (DecisionTaken restart)
* re-form: -> the next attempt's workers started (rendezvous, backoff, warm fork or cold spawn)
* load: -> every rank resumed (script start, process group, checkpoint load: TrainingResumed)
* first step: -> every rank completed its first step of the new attempt

A phase whose event is missing (no SDK: no TrainingResumed or steps) is None, and so is the total.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..events import (
    DecisionTaken,
    Event,
    FailureDetected,
    StepCompleted,
    TrainingResumed,
    WorkersStarted,
    WorkersStopped,
)

PHASES = ("detect", "tear_down", "decide", "re_form", "load", "first_step")


@dataclass(frozen=True)
class Recovery:
    attempt: int  # the attempt that failed
    failure: str
    rank: int
    path: str  # warm | cold | mixed | "" (no start recorded: the run stopped)
    why: str
    phases: dict[str, float | None]

    @property
    def total_s(self) -> float | None:
        vals = list(self.phases.values())
        return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)


E = TypeVar("E", bound=Event)


def _first(
    evs: list[Event], kind: type[E], after: float, pred: Callable[[E], bool] = lambda e: True
) -> E | None:
    """The first event of ``kind`` at or after ``after`` for which ``pred`` holds."""
    return next((e for e in evs if isinstance(e, kind) and e.ts >= after and pred(e)), None)


def recoveries(events: list[Event]) -> list[Recovery]:
    """One Recovery per FailureDetected that was followed by a restart."""
    evs = sorted(events, key=lambda e: e.ts)
    found = (_recovery(evs, fd) for fd in evs if isinstance(fd, FailureDetected))
    return [r for r in found if r is not None]


def _recovery(evs: list[Event], fd: FailureDetected) -> Recovery | None:
    a = fd.attempt
    stopped = _first(evs, WorkersStopped, fd.ts, lambda e: e.attempt == a)
    decided = _first(evs, DecisionTaken, fd.ts, lambda e: e.attempt == a and e.action in ("restart", "stop"))
    if decided is None or decided.action != "restart":
        return None
    start = _first(evs, DecisionTaken, decided.ts, lambda e: e.attempt > a and e.action.startswith("start_"))
    nxt = start.attempt if start is not None else a + 1
    started = [e for e in evs if isinstance(e, WorkersStarted) and e.attempt == nxt]
    resumed = [e for e in evs if isinstance(e, TrainingResumed) and e.attempt == nxt]
    first_steps: dict[int, float] = {}
    for e in evs:
        if isinstance(e, StepCompleted) and e.attempt == nxt and e.rank not in first_steps:
            first_steps[e.rank] = e.ts
    marks: list[float | None] = [
        fd.onset,
        fd.ts,
        stopped.ts if stopped is not None else None,
        decided.ts,
        max(e.ts for e in started) if started else None,
        max(e.ts for e in resumed) if resumed else None,
        max(first_steps.values()) if first_steps else None,
    ]
    phases: dict[str, float | None] = {}
    prev = marks[0]
    for name, mark in zip(PHASES, marks[1:], strict=True):
        phases[name] = None if mark is None or prev is None else max(0.0, mark - prev)
        prev = mark if mark is not None else prev
    path, why = "", ""
    if start is not None:
        path = start.action.removeprefix("start_")
        why = start.reason.split(": ", 1)[1] if ": " in start.reason else start.reason
        if start.reason.startswith("mixed"):
            path = "mixed"
    return Recovery(a, fd.failure, fd.rank, path, why, phases)
