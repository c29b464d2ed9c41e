"""Each interruption's recovery: the path taken (warm or cold, and why) and its phases, from the ledger.

Phases, in order (seconds; each from the end of the previous one):

* detect: fault onset -> FailureDetected
* tear down: -> the failed attempt's workers stopped (WorkersStopped)
* decide: -> the restart decision (DecisionTaken restart)
* re-form: -> the next attempt's workers started (rendezvous, backoff, warm fork or cold spawn)
* load: -> every rank resumed (script start, process group, checkpoint load: TrainingResumed)
* first step: -> every rank completed its first step of the new attempt

A phase whose event is missing (no SDK: no TrainingResumed or steps) is None, and so is the total.

An in-place recovery (path ``in-place``: the survivors stayed, only the failed ranks were replaced,
the state came from a live replica) fills the same columns from its own record (ReformedInPlace):
tear down = the survivors leaving the broken group, decide = detection -> the in-place decision,
re-form = replacements started + the new group formed, load = the live-state transfer, first step as
above. When the in-place rung failed, the whole-group recovery that followed says why in ``why``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..events import (
    LEFT_IN_MEMORY,
    DecisionTaken,
    Event,
    FailureDetected,
    ReformedInPlace,
    StepCompleted,
    TrainingResumed,
    WorkersStarted,
    WorkersStopped,
)
from ..policy.vocabulary import RecoveryDecision, RecoveryPath

IN_PLACE = RecoveryPath.IN_PLACE  # survivors kept, only the failed ranks replaced
# the in-place rung's decisions; taken: the failed ranks replaced, or a lost node's survivors shrunk
TAKEN = (RecoveryDecision.IN_PLACE, RecoveryDecision.SHRINK_IN_PLACE)
RUNGS = (*TAKEN, RecoveryDecision.IN_PLACE_SKIPPED, RecoveryDecision.IN_PLACE_FAILED)
PHASES = ("detect", "tear_down", "decide", "re_form", "load", "first_step")


@dataclass(frozen=True)
class Recovery:
    attempt: int  # the attempt that failed
    failure: str
    rank: int
    path: str  # in-place | warm | cold | mixed | "" (no start recorded: the run stopped)
    why: str
    phases: dict[str, float | None]
    ended: float | None = None  # when every rank had stepped again (epoch seconds); None: not measured

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
    """One Recovery per interruption that was followed by a restart (or recovered in place). An
    interruption is grouped as the reliability account groups it: several ranks or hosts that saw
    the same fault (a lost node's survivors, both sides of a partition) give one row, told from its
    root detection (a root cause before a lost peer, else the first)."""
    return [r for r in recovery_per_interruption(events) if r is not None]


def recovery_per_interruption(events: list[Event]) -> list[Recovery | None]:
    """The recovery of every interruption, None where none followed, in the order and grouping of the
    reliability account's interruptions (``interruptions_from_events``): the two lists pair up."""
    from .reliability import failure_groups, one_fault_across_hosts  # deferred: heavy (pydantic)

    evs = sorted(events, key=lambda e: e.ts)
    found: list[Recovery | None] = []
    for group in one_fault_across_hosts(failure_groups(evs)):
        root = next((f for f in group if f.failure != "peer_lost"), group[0])
        rec = _recovery(evs, root)
        if rec is None:  # the root's node ended there (a killed host): the first that recovered
            rec = next(
                (r for r in (_recovery(evs, f) for f in group if f is not root) if r is not None), None
            )
        found.append(rec)
    return found


def _in_place(evs: list[Event], fd: FailureDetected) -> Recovery | None:
    """The in-place recovery of ``fd``, if its rung was taken and completed."""
    a = fd.attempt
    chosen = _first(evs, DecisionTaken, fd.ts, lambda e: e.attempt == a and e.action in RUNGS)
    if chosen is None or chosen.action not in TAKEN:
        return None
    done = _first(evs, ReformedInPlace, chosen.ts, lambda e: e.attempt == a)
    nxt = _first(evs, FailureDetected, fd.ts, lambda e: e.attempt == a and e is not fd)
    if done is None or (nxt is not None and nxt.ts < done.ts):
        return None
    ph = done.phases
    # every rank's first step from the resumed one on, after the failure: a step's record carries its
    # rank's own time, the re-formation's the agent's, which a loaded machine can wake late (the steps
    # then come before it; hog CI run 20). No rank completes the resumed step before the failure: it is
    # the step the failure interrupted, or one after it.
    first: dict[int, float] = {}
    for e in evs:
        if isinstance(e, StepCompleted) and e.attempt == a and e.ts > fd.ts and e.step >= done.step:
            first.setdefault(e.rank, e.ts)
    phases: dict[str, float | None] = {
        "detect": max(0.0, fd.ts - fd.onset) if fd.onset else None,
        "tear_down": ph.get("abort", 0.0),
        "decide": max(0.0, chosen.ts - fd.ts),
        "re_form": ph.get("replace", ph.get("join", 0.0)) + ph.get("wait", 0.0) + ph.get("rendezvous", 0.0),
        "load": ph.get("transfer", 0.0),
        "first_step": max(0.0, max(first.values()) - done.ts) if first else None,
    }
    ended = max(first.values()) if first else None
    return Recovery(a, fd.failure, fd.rank, IN_PLACE, chosen.reason, phases, ended)


def _recovery(evs: list[Event], fd: FailureDetected) -> Recovery | None:
    a = fd.attempt
    in_place = _in_place(evs, fd)
    if in_place is not None:
        return in_place
    stopped = _first(evs, WorkersStopped, fd.ts, lambda e: e.attempt == a)
    decided = _first(evs, DecisionTaken, fd.ts, lambda e: e.attempt == a and e.action in ("restart", "stop"))
    if decided is None or decided.action != "restart":
        return None
    start = _first(evs, DecisionTaken, decided.ts, lambda e: e.attempt > a and e.action.startswith("start_"))
    nxt = start.attempt if start is not None else a + 1
    # the new attempt's events up to its own next failure: a later recovery in place within it
    # (replacements started, resumed from live state) belongs to that failure, not to this one
    upto = _first(evs, FailureDetected, decided.ts, lambda e: e.attempt == nxt)
    ours = [e for e in evs if e.attempt == nxt and (upto is None or e.ts < upto.ts)]
    started = [e for e in ours if isinstance(e, WorkersStarted)]
    resumed = [e for e in ours if isinstance(e, TrainingResumed)]
    first_steps: dict[int, float] = {}
    for e in ours:
        if isinstance(e, StepCompleted) and e.rank not in first_steps:
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
    # each phase from the end of the previous one; a mark earlier than the one before it (an unchanged
    # script's first step hooked before its resume was told) ends its phase at once: the phases add
    # up to the newest mark, the moment every rank had stepped again
    phases: dict[str, float | None] = {}
    prev = marks[0]
    for name, mark in zip(PHASES, marks[1:], strict=True):
        phases[name] = None if mark is None or prev is None else max(0.0, mark - prev)
        if mark is not None:
            prev = mark if prev is None else max(prev, mark)
    ended = prev if marks[-1] is not None and all(v is not None for v in phases.values()) else None
    path, why = "", ""
    if start is not None:
        path = start.action.removeprefix("start_")
        why = start.reason.split(": ", 1)[1] if ": " in start.reason else start.reason
        if start.reason.startswith("mixed"):
            path = "mixed"
    left = _first(evs, DecisionTaken, fd.ts, lambda e: e.attempt == a and e.action.startswith("in_place_"))
    if left is not None and left.ts <= decided.ts:
        why = f"in-place not taken ({left.reason}); {path}: {why}" if path else left.reason
    source = next((e for e in resumed if e.from_checkpoint.endswith(LEFT_IN_MEMORY)), None)
    if source is not None:  # the loop idiom's survivors left their live state (train/left_state.py)
        holder = source.from_checkpoint.removeprefix("live:").removesuffix(LEFT_IN_MEMORY)
        why += (
            f"; state: the live state after step {source.step} that the survivors left in node memory "
            f"(from {holder.replace('rank', 'rank ')}), nothing rolled back to a checkpoint"
        )
    return Recovery(a, fd.failure, fd.rank, path, why, phases, ended)
