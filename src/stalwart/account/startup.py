"""Where a node's start-up went: the report's start-up bucket split into phases, and the same split
the live console prints at the first step.

Marks, on the wall clock, each phase from the end of the one before:

* ``python``: the process started (``JobStarted.ts``) -> Stalwart's agent begins its work
  (``StartupMarks.imported``): the interpreter, Stalwart's imports, settings;
* ``services``: -> the node's services are up (``StartupMarks.services``): the memory tier, live
  diagnosis, the fork server launched (its imports go on in the background), the job key;
* ``rendezvous``: -> the first attempt's world is agreed (its ``AttemptStarted``): the store, the
  other nodes' arrival;
* ``workers``: -> the workers are started (the attempt's ``start_warm``/``start_cold`` decision): the
  fork server's readiness and the fork, or a cold spawn;
* ``script``: -> the first step begins (the earliest ``StepCompleted.start`` of the attempt): the
  script's own imports, its process group, model and first batch.

A mark that is missing (no SDK: no steps; an older ledger: no ``StartupMarks``) leaves its phase and
the next one unknown (None); a mark earlier than the one before it ends its phase at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..events import AttemptStarted, DecisionTaken, Event, JobStarted, StepCompleted
from ..events.startup import StartupMarks

PHASES = ("python", "services", "rendezvous", "workers", "script")
WHAT = {
    "python": "Python start and imports",
    "services": "node services",
    "rendezvous": "rendezvous",
    "workers": "starting workers",
    "script": "script until its first step",
}


@dataclass(frozen=True)
class NodeStartup:
    node: str
    phases: dict[str, float | None]

    @property
    def total_s(self) -> float | None:
        vals = list(self.phases.values())
        return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)


def split(marks: Sequence[float | None]) -> dict[str, float | None]:
    """The phases between consecutive marks (``len(PHASES) + 1`` of them, the first the process start)."""
    if len(marks) != len(PHASES) + 1:
        raise ValueError(f"{len(PHASES) + 1} marks are needed, got {len(marks)}")
    out: dict[str, float | None] = {}
    prev = marks[0]
    for name, mark in zip(PHASES, marks[1:], strict=True):
        out[name] = None if mark is None or prev is None else max(0.0, mark - prev)
        prev = mark if mark is None or prev is None else max(prev, mark)
    return out


def line(phases: dict[str, float | None]) -> str:
    """One line: the known total and each phase, e.g. "start-up 9.31s before the first step: ..."."""
    known = [(WHAT[k], v) for k, v in phases.items() if v is not None]
    if not known:
        return "start-up: no phase was measured"
    total = sum(v for _, v in known)
    parts = ", ".join(f"{what} {v:.2f}s" for what, v in known)
    missing = [WHAT[k] for k, v in phases.items() if v is None]
    unknown = f" ({', '.join(missing)}: not measured)" if missing else ""
    return f"start-up {total:.2f}s before the first step: {parts}{unknown}"


def startups(events: Sequence[Event]) -> list[NodeStartup]:
    """Each node's first start-up in the ledger (its first job start, its first attempt), by node."""
    out = []
    for node in sorted({e.node for e in events if isinstance(e, JobStarted)}):
        mine = [e for e in events if e.node == node]
        job = next(e for e in mine if isinstance(e, JobStarted))
        after = [e for e in mine if e.ts >= job.ts]
        marks = next((e for e in after if isinstance(e, StartupMarks)), None)
        attempt = next((e for e in after if isinstance(e, AttemptStarted)), None)
        started = (
            None
            if attempt is None
            else next(
                (
                    e
                    for e in after
                    if isinstance(e, DecisionTaken)
                    and e.attempt == attempt.attempt
                    and e.action.startswith("start_")
                ),
                None,
            )
        )
        first = (
            None
            if attempt is None
            else min(
                (e.start for e in after if isinstance(e, StepCompleted) and e.attempt == attempt.attempt),
                default=None,
            )
        )
        points: list[float | None] = [
            job.ts,
            marks.imported if marks is not None else None,
            marks.services if marks is not None else None,
            attempt.ts if attempt is not None else None,
            started.ts if started is not None else None,
            first,
        ]
        out.append(NodeStartup(node, split(points)))
    return out


class StartupWatch:
    """The live console's copy of the same split: the marks from the events as the agent writes them,
    told once, at the first step of the first attempt (the same phases ``startups`` reads back)."""

    def __init__(self) -> None:
        self.marks: list[float | None] = [None] * (len(PHASES) + 1)
        self.attempt: int | None = None
        self.told = False

    def seen(self, ev: Event) -> None:
        m = self.marks
        if isinstance(ev, JobStarted) and m[0] is None:
            m[0] = ev.ts
        elif isinstance(ev, StartupMarks) and m[1] is None:
            m[1], m[2] = ev.imported, ev.services
        elif isinstance(ev, AttemptStarted) and self.attempt is None:
            m[3], self.attempt = ev.ts, ev.attempt
        elif isinstance(ev, DecisionTaken) and ev.action.startswith("start_") and m[4] is None:
            m[4] = ev.ts if ev.attempt == self.attempt else None

    def first_step(self, attempt: int, start: float) -> str | None:
        """The line to print at the first step of the first attempt; None otherwise, or once told."""
        if self.told or self.attempt is None or attempt != self.attempt:
            return None
        self.told = True
        self.marks[-1] = start
        return line(split(self.marks))
