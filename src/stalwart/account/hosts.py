"""What each host saw, beside the merged account of a multi-host run (pure functions over events).

Every agent writes its own ledger into the run directory (``ledger/agent-<node>-<pid>.ledger``);
the report reads them all as one run (account/goodput.py merges them into one timeline, where a
host's late detection never overwrites the time the others trained). This module keeps each
host's own view next to it: the attempts it took part in and at which world size, the steps its
ranks completed in each, how long those attempts trained, the failures it detected with how long
each took it to notice, and its own verdict. A host cut off by a partition shows its late
detection here, and the survivor shows the steps it trained alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..events import AttemptStarted, Event, FailureDetected, JobEnded, StepCompleted
from ..terminal import plural


@dataclass(frozen=True)
class HostAttempt:
    """One attempt as one host lived it."""

    attempt: int
    num_nodes: int  # hosts in the round
    world_size: int
    steps: int  # distinct steps this host's ranks completed in it
    first_step: int  # -1: none
    last_step: int
    trained_s: float  # first step's start to last step's end, on this host


@dataclass(frozen=True)
class HostDetection:
    failure: str
    onset: float
    detected: float
    step: int

    @property
    def detection_s(self) -> float:
        return max(0.0, self.detected - self.onset)


@dataclass(frozen=True)
class HostView:
    node: str
    attempts: tuple[HostAttempt, ...]
    detections: tuple[HostDetection, ...]
    outcome: str  # its own verdict's outcome ("running" without one)
    exit_code: int | None

    @property
    def steps(self) -> int:
        return sum(a.steps for a in self.attempts)

    @property
    def trained_s(self) -> float:
        return sum(a.trained_s for a in self.attempts)

    def line(self) -> str:
        """One line: what this host saw."""
        parts = []
        for a in self.attempts:
            if a.steps:
                parts.append(
                    f"attempt {a.attempt} ({plural(a.num_nodes, 'host')}, world "
                    f"{a.world_size}): {plural(a.steps, 'step')} {a.first_step}-{a.last_step} in {a.trained_s:.2f}s"
                )
            else:
                parts.append(
                    f"attempt {a.attempt} ({plural(a.num_nodes, 'host')}, world {a.world_size}): no step"
                )
        seen = "; ".join(parts) or "no attempt"
        noticed = ", ".join(
            f"{d.failure} after {d.detection_s:.2f}s (step {d.step})" for d in self.detections
        )
        code = f", exit {self.exit_code}" if self.exit_code is not None else ""
        return f"{self.node}: {seen}; detected {noticed or 'nothing'}; {self.outcome}{code}"


def host_views(events: Sequence[Event]) -> tuple[HostView, ...]:
    """Each host's own view of the run, in node-name order (pure)."""
    nodes = sorted({e.node for e in events if e.node and isinstance(e, (AttemptStarted, StepCompleted))})
    return tuple(_view(node, [e for e in events if e.node == node]) for node in nodes)


def _view(node: str, mine: Sequence[Event]) -> HostView:
    started: dict[int, AttemptStarted] = {}
    for e in mine:
        if isinstance(e, AttemptStarted) and e.attempt not in started:
            started[e.attempt] = e
    steps: dict[int, dict[int, list[StepCompleted]]] = {}
    for e in mine:
        if isinstance(e, StepCompleted):
            steps.setdefault(e.attempt, {}).setdefault(e.step, []).append(e)
    attempts = []
    for n in sorted(set(started) | set(steps)):
        st = started.get(n)
        done = steps.get(n, {})
        all_steps = [s for group in done.values() for s in group]
        attempts.append(
            HostAttempt(
                attempt=n,
                num_nodes=st.num_nodes if st is not None else 0,
                world_size=st.world_size if st is not None else 0,
                steps=len(done),
                first_step=min(done, default=-1),
                last_step=max(done, default=-1),
                trained_s=(
                    max(s.start + s.duration for s in all_steps) - min(s.start for s in all_steps)
                    if all_steps
                    else 0.0
                ),
            )
        )
    detections = tuple(
        HostDetection(e.failure, e.onset, e.ts, e.step)
        for e in sorted(mine, key=lambda e: e.ts)
        if isinstance(e, FailureDetected)
    )
    ends = [e for e in mine if isinstance(e, JobEnded)]
    last = max(ends, key=lambda e: e.ts) if ends else None
    return HostView(
        node=node,
        attempts=tuple(attempts),
        detections=_first_per_onset(detections),
        outcome=last.outcome if last is not None else "running",
        exit_code=last.exit_code if last is not None else None,
    )


def _first_per_onset(found: tuple[HostDetection, ...]) -> tuple[HostDetection, ...]:
    """One detection per fault: the host's ranks often report the same one several times."""
    out: list[HostDetection] = []
    for d in found:
        if out and abs(out[-1].onset - d.onset) < 1e-6:
            continue
        out.append(d)
    return tuple(out)


__all__ = ["HostAttempt", "HostDetection", "HostView", "host_views"]
