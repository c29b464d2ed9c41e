"""The reduced-batch account: when the group trained below its launched world size (pure functions).

A group that shrank in place (a lost node, no hot spare) keeps training with fewer ranks; with a
fixed per-rank batch each of those steps averages the gradient over fewer samples. Goodput counts
such steps as productive (they are progress); this account says what they cost in samples. It
assumes the per-rank batch is fixed (the ledger does not record batch sizes): a script that splits
a fixed global batch over ``session.world_size`` sees every sample, and the forgone figure does not
apply to it.

* each **change** of the world size within an attempt, from the ledger's ``ReformedInPlace`` with
  ``shrunk_from`` or ``grown_from`` (written by the node that decided it; a copy on another node's
  ledger is counted once): when, from which size to which, the step the new group started at, the
  re-formation's recorded phases (``reform_s``) and the pause in training around it (``pause_s``:
  the end of the last step before it to the start of the first step after, over every rank);
* each **period** below the attempt's launched world size (``AttemptStarted.world_size``), from a
  shrink to the next change or to the attempt's end: the world size, the distinct step numbers
  completed in it (every rank records each step; a step counts once however many ranks and
  ledgers hold it), the wall seconds from its first step's start to its last step's end, and the
  samples forgone as full-size steps: ``steps x (1 - world / full)``.

A period's steps are the attempt's steps completed after the shrink was decided (the deciding
node's ``DecisionTaken``; without one, the re-formation's start from its phases) and, when a change
ended it, completed before that change's record and numbered below the step it started at.
Attempts are told apart per job of the run (attempt numbers start again in every job). An attempt
launched smaller than an earlier one (a whole-group restart at fewer nodes) is not a shrink in
place: it is not counted here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..events import (
    AttemptStarted,
    DecisionTaken,
    Event,
    JobEnded,
    JobStarted,
    ReformedInPlace,
    StepCompleted,
)
from ..policy.vocabulary import RecoveryDecision
from ..terminal import plural
from .goodput import job_windows

DECISIONS = (RecoveryDecision.SHRINK_IN_PLACE, RecoveryDecision.GROW_IN_PLACE)


@dataclass(frozen=True)
class WorldChange:
    """The group re-formed in place at another world size."""

    ts: float  # when every rank had re-formed (the ReformedInPlace record)
    attempt: int
    node: str  # the node that decided it
    kind: str  # shrink | grow
    from_world: int
    to_world: int
    step: int  # the first step the re-formed group runs
    reform_s: float  # the re-formation's recorded phases, summed
    pause_s: float | None  # last step's end before it -> first step's start after (None: no step on a side)


@dataclass(frozen=True)
class ReducedPeriod:
    """A stretch of an attempt trained below its launched world size."""

    attempt: int
    world_size: int
    full_world: int  # the attempt's launched world size
    steps: int  # distinct step numbers completed in it
    first_step: int  # -1: none
    last_step: int
    wall_s: float  # first step's start to last step's end
    ended_by: str  # grow | shrink (a further change) | attempt_end

    @property
    def forgone_step_equivalents(self) -> float:
        """The samples not seen, as full-size steps."""
        return self.steps * (1 - self.world_size / self.full_world) if self.full_world else 0.0


@dataclass(frozen=True)
class WorldChanges:
    changes: tuple[WorldChange, ...]
    periods: tuple[ReducedPeriod, ...]

    def summary(self) -> dict[str, float | int]:
        return {
            "reduced_steps": sum(p.steps for p in self.periods),
            "forgone_step_equivalents": round(sum(p.forgone_step_equivalents for p in self.periods), 3),
            "reduced_s": round(sum(p.wall_s for p in self.periods), 3),
        }


def _began(ev: ReformedInPlace, decisions: Sequence[DecisionTaken]) -> float:
    """When the change was decided: the deciding node's last such decision before its record, else
    the record's time less its phases."""
    found = [
        d.ts
        for d in decisions
        if d.node == ev.node and d.attempt == ev.attempt and d.action in DECISIONS and d.ts <= ev.ts
    ]
    return max(found) if found else ev.ts - sum(ev.phases.values())


def _is_change(e: Event) -> bool:
    return isinstance(e, ReformedInPlace) and e.world_size > 0 and bool(e.shrunk_from or e.grown_from)


def world_changes(events: Sequence[Event]) -> WorldChanges:
    """The run's changes of world size in place and its periods below the launched size (pure)."""
    evs = sorted(events, key=lambda e: e.ts)
    windows = job_windows(
        [e for e in evs if isinstance(e, JobStarted)], [e for e in evs if isinstance(e, JobEnded)], evs
    )

    def key(e: Event, t: float) -> tuple[int, int]:  # attempt numbers start again in every job
        return sum(1 for a, _ in windows if a <= t), e.attempt

    decisions = [e for e in evs if isinstance(e, DecisionTaken)]
    steps: dict[tuple[int, int], list[StepCompleted]] = {}
    for s in evs:
        if isinstance(s, StepCompleted):
            steps.setdefault(key(s, s.start), []).append(s)
    by_attempt: dict[tuple[int, int], list[tuple[ReformedInPlace, float]]] = {}
    seen: set[tuple[int, int, int, int, int]] = set()
    for e in evs:
        if not _is_change(e):
            continue
        assert isinstance(e, ReformedInPlace)
        k = key(e, e.ts)
        once = (*k, e.shrunk_from or e.grown_from, e.world_size, e.step)
        if once not in seen:  # another node's record of the same change counts once
            seen.add(once)
            by_attempt.setdefault(k, []).append((e, _began(e, decisions)))
    changes: list[WorldChange] = []
    periods: list[ReducedPeriod] = []
    for k, found in by_attempt.items():
        mine = steps.get(k, [])
        first = found[0][0]
        full = max(
            (
                a.world_size
                for a in evs
                if isinstance(a, AttemptStarted) and key(a, a.ts) == k and a.ts <= first.ts
            ),
            default=max(first.shrunk_from, first.grown_from, first.world_size),
        )
        for i, (e, begin) in enumerate(found):
            changes.append(_change(e, begin, mine))
            if e.world_size >= full:
                continue
            nxt = found[i + 1] if i + 1 < len(found) else None
            if nxt is None:
                periods.append(_period(k[1], e.world_size, full, mine, begin, e.step, None, "attempt_end"))
            else:
                ended_by = "grow" if nxt[0].world_size > e.world_size else "shrink"
                periods.append(_period(k[1], e.world_size, full, mine, begin, e.step, nxt, ended_by))
    return WorldChanges(tuple(changes), tuple(periods))


def _change(e: ReformedInPlace, begin: float, steps: Sequence[StepCompleted]) -> WorldChange:
    old = e.shrunk_from or e.grown_from
    before = [s.start + s.duration for s in steps if s.step < e.step and s.ts <= e.ts]
    after = [s.start for s in steps if s.step >= e.step and s.ts > begin]
    return WorldChange(
        ts=e.ts,
        attempt=e.attempt,
        node=e.node,
        kind="grow" if e.world_size > old else "shrink",
        from_world=old,
        to_world=e.world_size,
        step=e.step,
        reform_s=round(sum(e.phases.values()), 6),
        pause_s=round(max(0.0, min(after) - max(before)), 6) if before and after else None,
    )


def _period(
    attempt: int,
    world: int,
    full: int,
    steps: Sequence[StepCompleted],
    begin: float,
    start: int,
    nxt: tuple[ReformedInPlace, float] | None,
    ended_by: str,
) -> ReducedPeriod:
    """The steps from ``start`` (the step the change resumed at) completed after ``begin`` and, when a
    further change ended the period, before its record and numbered below the step it started at. A
    survivor can complete the step before ``start`` after the change began (its step did not need the
    lost node: CI run 21): that step ran at the old size."""
    mine = [
        s
        for s in steps
        if s.ts > begin and s.step >= start and (nxt is None or (s.ts <= nxt[0].ts and s.step < nxt[0].step))
    ]
    numbers = {s.step for s in mine}
    return ReducedPeriod(
        attempt=attempt,
        world_size=world,
        full_world=full,
        steps=len(numbers),
        first_step=min(numbers, default=-1),
        last_step=max(numbers, default=-1),
        wall_s=round(max(s.start + s.duration for s in mine) - min(s.start for s in mine), 6)
        if mine
        else 0.0,
        ended_by=ended_by,
    )


def _fewer(world: int, full: int) -> str:
    share = 1 - world / full
    words = {1 / 2: "half", 1 / 3: "a third", 1 / 4: "a quarter", 2 / 3: "two thirds"}
    named = next((w for f, w in words.items() if abs(f - share) < 1e-9), None)
    return f"{named} fewer samples per step" if named else f"{100 * share:.0f}% fewer samples per step"


def lines(rep: dict) -> list[str]:
    """The report's short section, in plain words; none when the group never shrank (pure)."""
    changes = rep.get("changes") or []
    if not any(c["kind"] == "shrink" for c in changes):
        return []
    out = []
    for p in rep.get("periods") or []:
        span = f"steps {p['first_step']}-{p['last_step']}, " if p["steps"] else ""
        out.append(
            f"Trained at a reduced batch: {p['steps']} step{'s' if p['steps'] != 1 else ''} ({span}"
            f"{p['wall_s']:.1f} s) at world {p['world_size']} of {p['full_world']} "
            f"(with a fixed per-rank batch, {_fewer(p['world_size'], p['full_world'])}; "
            f"{p['forgone_step_equivalents']:.1f} full steps' worth of samples not seen)."
        )
    said = []
    for c in changes:
        verb = "shrank" if c["kind"] == "shrink" else "grew"
        pause = c["pause_s"] if c["pause_s"] is not None else c["reform_s"]
        what = "training paused" if c["pause_s"] is not None else "re-formation took"
        said.append(f"{verb} {c['from_world']}->{c['to_world']} at step {c['step']} ({what} {pause:.1f} s)")
    joined = "; ".join(said)
    out.append(joined[:1].upper() + joined[1:] + ".")
    s = rep["summary"]
    if len(rep.get("periods") or []) > 1:
        out.append(
            f"In all: {plural(s['reduced_steps'], 'step')} over {s['reduced_s']:.1f} s below the launched world size; "
            f"{s['forgone_step_equivalents']:.1f} full steps' worth of samples not seen."
        )
    return out


__all__ = ["ReducedPeriod", "WorldChange", "WorldChanges", "lines", "world_changes"]
