"""Goodput and badput of one run: every second of wall time goes into exactly one bucket.

The timeline is built from ledger events (pure function, no clocks):

* **productive**: between the first and last step of an attempt, progress that survived;
* **checkpoint_stall**: time the training loop was blocked by a save (staging; not the background
  persist, which overlaps training);
* **checkpoint_restore**: loading a checkpoint at start or after a restart;
* **lost_work**: work done after the snapshot of the newest checkpoint committed before a fault
  (re-done later);
* **detection**: from the fault's onset to its detection;
* **restart**: from detection (or an attempt's end) to the next attempt's first step, less restore;
* **startup**: from job start to the first step, less restore;
* **straggler_slowdown**: the part of a surviving step beyond ``slow_factor`` x the ideal step time;
* **shutdown**: after the last step until the job ended;
* **other**: anything not claimed above (in practice: none, or gaps of a few ms);
* **queue**: between the jobs of one run (a preempted job ended, the requeued one had not yet
  started): no job was running, so nothing in the gap is productive (it wins over every bucket).

Where intervals overlap, the bucket earlier in this list wins; sweeping over the boundaries
assigns each elementary interval once, so the buckets add up to the wall time exactly.

Several agents' ledgers make one timeline: a fault's detection and restart end where the job was
training again, so a host that noticed late (cut off by a partition while the others re-formed and
trained on) never books the survivors' productive time as its detection, and a fault of a host
that was not in the group training at its onset costs the job nothing; what each host saw on its
own is account/hosts.py's.

Ideal step time follows Google's ml-goodput-measurement definition (mean of the step times at or
below median + 3 x MAD), computed over rank 0's steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import LedgerError
from ..events import (
    AttemptStarted,
    CheckpointCommitted,
    CheckpointLoaded,
    CheckpointStaged,
    DecisionTaken,
    Event,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from .recovery import TAKEN as IN_PLACE_TAKEN
from .reliability import Interruption, RunReliability, interruptions_from_events

BUCKETS = (
    "productive",
    "checkpoint_stall",
    "checkpoint_restore",
    "lost_work",
    "detection",
    "restart",
    "startup",
    "straggler_slowdown",
    "shutdown",
    "other",
    "queue",
)
_PRIORITY = {
    "queue": 10,
    "checkpoint_stall": 9,
    "checkpoint_restore": 8,
    "detection": 7,
    "lost_work": 6,
    "straggler_slowdown": 5,
    "productive": 4,
    "restart": 3,
    "startup": 2,
    "shutdown": 2,
    "other": 0,
}


@dataclass(frozen=True)
class Segment:
    """The steps of one attempt of the agent that ran global rank 0."""

    node: str
    attempt: int
    first_start: float
    last_end: float
    first_step: int
    last_step: int
    steps: int


@dataclass(frozen=True)
class InterruptionCost:
    onset: float
    detected: float
    failure: str
    rank: int
    step: int
    node: str
    component: str
    detection_s: float
    lost_work_s: float
    lost_since: float  # when the surviving work ended (last checkpoint commit or attempt start)
    recovery_s: float | None  # detection -> first productive step after restart
    total_s: float | None


@dataclass(frozen=True)
class Goodput:
    job_start: float
    job_end: float
    wall_s: float
    buckets: dict[str, float]
    ideal_step_s: float
    steps_completed: int
    interruptions: tuple[InterruptionCost, ...]
    finished: bool
    outcome: str = ""
    verdict: str = ""
    exit_code: int | None = None
    segments: tuple[Segment, ...] = field(default_factory=tuple)
    jobs: int = 1  # jobs of the run (a requeued run has one per requeue)
    preemptions: tuple[float, ...] = ()  # when each preempted job ended
    timeline: tuple[tuple[float, float, str], ...] = ()  # (from, to, bucket): the wall time, in order
    reliability: RunReliability | None = None  # the interruptions, exposure and recoveries it was told from

    @property
    def goodput(self) -> float:
        return self.buckets["productive"] / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def badput_s(self) -> float:
        return self.wall_s - self.buckets["productive"]


def ideal_step_time(durations: Sequence[float]) -> float:
    """Mean of the step times at or below median + 3 x MAD (robust to restart and checkpoint outliers)."""
    if not durations:
        return 0.0
    med = statistics.median(durations)
    mad = statistics.median(abs(d - med) for d in durations)
    kept = [d for d in durations if d <= med + 3 * mad]
    return sum(kept) / len(kept)


def _segments(
    steps: list[StepCompleted], windows: Sequence[tuple[float, float]] = (), splits: Sequence[float] = ()
) -> list[Segment]:
    """One segment per (job, node, attempt, generation): attempt numbers start again in every job of
    a run; an in-place recovery (``splits``: when each was decided) starts a new generation of the
    process group within the attempt."""
    by_key: dict[tuple[int, str, int, int], list[StepCompleted]] = {}
    for s in steps:
        job = sum(1 for a, _ in windows if a <= s.start)
        gen = sum(1 for t in splits if t <= s.start)
        by_key.setdefault((job, s.node, s.attempt, gen), []).append(s)
    out = []
    for (_, node, attempt, _), group in by_key.items():
        out.append(
            Segment(
                node,
                attempt,
                min(s.start for s in group),
                max(s.start + s.duration for s in group),
                min(s.step for s in group),
                max(s.step for s in group),
                len(group),
            )
        )
    return sorted(out, key=lambda seg: seg.first_start)


def _sweep(
    intervals: list[tuple[float, float, str]], t0: float, t1: float
) -> tuple[dict[str, float], list[tuple[float, float, str]]]:
    """Assign every instant of [t0, t1] to the highest-priority interval covering it: the totals per
    bucket, and the pieces in time order (neighbours of one bucket joined)."""
    points = {t0, t1}
    clipped = []
    for a, b, label in intervals:
        a, b = max(a, t0), min(b, t1)
        if b > a:
            clipped.append((a, b, label))
            points.update((a, b))
    edges = sorted(points)
    totals = dict.fromkeys(BUCKETS, 0.0)
    # events: at each edge, which intervals start/stop; keep active counts per label
    starts: dict[float, list[str]] = {}
    stops: dict[float, list[str]] = {}
    for a, b, label in clipped:
        starts.setdefault(a, []).append(label)
        stops.setdefault(b, []).append(label)
    active = dict.fromkeys(BUCKETS, 0)
    pieces: list[tuple[float, float, str]] = []
    for left, right in zip(edges, edges[1:], strict=False):
        for label in stops.get(left, ()):
            active[label] -= 1
        for label in starts.get(left, ()):
            active[label] += 1
        live = [lab for lab, n in active.items() if n > 0]
        label = max(live, key=_PRIORITY.__getitem__) if live else "other"
        totals[label] += right - left
        if pieces and pieces[-1][2] == label and pieces[-1][1] == left:
            pieces[-1] = (pieces[-1][0], right, label)
        else:
            pieces.append((left, right, label))
    return totals, pieces


def compute(events: Sequence[Event], *, slow_factor: float = 1.2) -> Goodput:
    """The goodput breakdown of the run whose events are given (all ledger files merged)."""
    if not events:
        raise LedgerError("the ledger holds no events", "point at the run directory of a run that started")
    starts = [e for e in events if isinstance(e, JobStarted)]
    ends = [e for e in events if isinstance(e, JobEnded)]
    if not starts:
        raise LedgerError(
            "the ledger has no JobStarted event", "is this the run directory of 'stalwart run'?"
        )
    t0 = min(e.ts for e in starts)
    t1 = max(e.ts for e in ends) if ends else max(e.ts for e in events)
    every_step = [e for e in events if isinstance(e, StepCompleted)]
    steps = sorted((e for e in every_step if e.rank == 0), key=lambda e: e.start)
    windows = job_windows(starts, ends, events)
    splits = [e.ts for e in events if isinstance(e, DecisionTaken) and e.action in IN_PLACE_TAKEN]
    segs = _segments(steps, windows, splits)
    ideal = ideal_step_time([s.duration for s in steps])
    commits = sorted(
        (e for e in events if isinstance(e, CheckpointCommitted) and e.rank <= 0), key=lambda e: e.ts
    )
    reliability = interruptions_from_events(events)
    intervals, snapshot_at = _checkpoint_intervals(events, commits)
    intervals += _step_intervals(steps, segs, ideal, slow_factor, t0, t1)
    resumes = sorted((e for e in events if isinstance(e, TrainingResumed)), key=lambda e: e.ts)
    step_end = {(s.node, s.attempt, s.step): s.start + s.duration for s in steps}
    costs = []
    attempt_starts = sorted(e.ts for e in events if isinstance(e, AttemptStarted))
    for it in reliability.interruptions:
        failed = next((s for s in reversed(segs) if s.first_start <= it.onset), None)
        began = max((t for t in attempt_starts if t <= it.onset), default=None)
        if failed is not None and began is not None and began > failed.last_end:
            failed = None  # the failing attempt never completed a step: it had no work to lose
        if failed is not None and it.node and it.node not in _hosts_in(failed, every_step):
            # a host outside the group that was training (it left, the others trained on without
            # it): its fault is its own view (account/hosts.py), the job lost nothing to it
            costs.append(_cost(it, it.onset, None, events))
            continue
        safe = _surviving_until(failed, segs, it, resumes, commits, snapshot_at, step_end)
        intervals.append((safe, it.onset, "lost_work"))
        # the job trained again (other hosts re-formed) before this host noticed: from then on the
        # late detection and its restart are this host's view, not the job's (account/hosts.py)
        back = next((s.first_start for s in segs if s.first_start > it.onset), t1)
        intervals.append((it.onset, min(it.detected, back), "detection"))
        nxt = next((s for s in segs if s.first_start > it.detected), None)
        if it.detected < back:
            intervals.append((it.detected, nxt.first_start if nxt else t1, "restart"))
        costs.append(_cost(it, safe, nxt, events))
    for (_, a_end), (b_start, _) in zip(windows, windows[1:], strict=False):
        if b_start > a_end:
            intervals.append((a_end, b_start, "queue"))
    totals, pieces = _sweep(intervals, t0, t1)
    last = max(ends, key=lambda e: e.ts) if ends else None
    return Goodput(
        job_start=t0,
        job_end=t1,
        wall_s=t1 - t0,
        buckets=totals,
        ideal_step_s=ideal,
        steps_completed=max((s.step + 1 for s in steps), default=0),
        interruptions=tuple(costs),
        finished=last is not None,
        outcome=last.outcome if last else "running",
        verdict=last.verdict if last else "",
        exit_code=last.exit_code if last else None,
        segments=tuple(segs),
        jobs=len(windows),
        preemptions=tuple(sorted(e.ts for e in ends if e.outcome == "preempted")),
        timeline=tuple(pieces),
        reliability=reliability,
    )


def _hosts_in(seg: Segment, every_step: Sequence[StepCompleted]) -> set[str]:
    """The hosts whose ranks completed steps while ``seg`` (global rank 0's) ran."""
    return {s.node for s in every_step if seg.first_start <= s.start <= seg.last_end}


def _checkpoint_intervals(
    events: Sequence[Event], commits: list[CheckpointCommitted]
) -> tuple[list[tuple[float, float, str]], dict[tuple[str, int, int], float]]:
    """Checkpoint stalls and restores as intervals, and when each checkpoint's snapshot was taken."""
    staged = {
        (e.node, e.attempt, e.step): e for e in events if isinstance(e, CheckpointStaged) and e.rank <= 0
    }
    intervals: list[tuple[float, float, str]] = []
    # the stall ends when staging ends; with a background persist the commit comes later
    snapshot_at: dict[tuple[str, int, int], float] = {}
    for key, st in staged.items():
        intervals.append((st.ts - st.stall_s, st.ts, "checkpoint_stall"))
        snapshot_at[key] = st.ts
    for c in commits:
        key = (c.node, c.attempt, c.step)
        if key not in staged and c.stall_s > 0:  # a synchronous save: the commit ends the stall
            intervals.append((c.ts - c.stall_s, c.ts, "checkpoint_stall"))
        snapshot_at.setdefault(key, c.ts)
    for ld in events:
        if isinstance(ld, CheckpointLoaded) and ld.rank <= 0:
            intervals.append((ld.ts - ld.duration_s, ld.ts, "checkpoint_restore"))
    return intervals, snapshot_at


def _step_intervals(
    steps: list[StepCompleted], segs: list[Segment], ideal: float, slow_factor: float, t0: float, t1: float
) -> list[tuple[float, float, str]]:
    """Productive segments, slow steps' excess, and the start-up, restarts and shutdown around them."""
    intervals = [(seg.first_start, seg.last_end, "productive") for seg in segs]
    for s in steps:
        if ideal > 0 and s.duration > slow_factor * ideal:
            intervals.append((s.start + ideal, s.start + s.duration, "straggler_slowdown"))
    for a, b in zip(segs, segs[1:], strict=False):
        intervals.append((a.last_end, b.first_start, "restart"))
    if segs:
        intervals.append((t0, segs[0].first_start, "startup"))
        intervals.append((segs[-1].last_end, t1, "shutdown"))
    else:
        intervals.append((t0, t1, "startup"))
    return intervals


def job_windows(
    starts: Sequence[JobStarted], ends: Sequence[JobEnded], events: Sequence[Event] = ()
) -> list[tuple[float, float]]:
    """When some job of the run was running: each agent's JobStarted up to its node's next JobEnded
    (open until the newest event if it has none), merged where they overlap, in time order.

    An agent killed outright (SIGKILL, a lost host) writes no JobEnded. Given the run's ``events``, its
    window ends with the last event of its node before that node's next JobStarted: the JobEnded of a
    later agent on the same node (a requeued job) would otherwise join the two jobs into one."""
    seen: dict[str, list[float]] = {}
    for e in events:
        seen.setdefault(e.node, []).append(e.ts)
    spans = []
    for st in starts:
        end = min((e.ts for e in ends if e.node == st.node and e.ts >= st.ts), default=float("inf"))
        if seen:
            nxt = min((o.ts for o in starts if o.node == st.node and o.ts > st.ts), default=float("inf"))
            if end >= nxt or end == float("inf"):  # no JobEnded of its own: its node's last word
                end = max((t for t in seen.get(st.node, ()) if st.ts <= t < nxt), default=st.ts)
        spans.append((st.ts, end))
    spans.sort()
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _surviving_until(
    seg: Segment | None,
    segs: list[Segment],
    it: Interruption,
    resumes: list[TrainingResumed],
    commits: list[CheckpointCommitted],
    snapshot_at: dict[tuple[str, int, int], float],
    step_end: dict[tuple[str, int, int], float],
) -> float:
    """When the work that survived the interruption ends: the snapshot the next attempt resumed from.

    A save whose background persist was still running at the fault may or may not have committed
    before the group was stopped, so the resume point is the ground truth. Without one (the job
    ended), the newest checkpoint committed before detection counts. A resume point with no
    checkpoint of this attempt behind it (an unchanged script's own, told by its parameters) keeps
    the steps before it: up to the end of the step before the one it resumed at.
    """
    if seg is None:
        return it.onset
    nxt = next((s for s in segs if s.first_start > it.detected), None)
    resumed = next(
        (r for r in resumes if r.ts > it.detected and (nxt is None or r.ts <= nxt.first_start)), None
    )
    if resumed is not None and resumed.from_checkpoint.startswith("live:"):
        return min(seg.last_end, it.onset)  # in place: every completed step survived in the replicas
    if resumed is not None:
        # the checkpoint resumed from holds the work up to its snapshot; one taken just after the
        # onset (the save in progress when a peer died) still holds everything done before it
        snap = snapshot_at.get((seg.node, seg.attempt, resumed.step))
        if snap is None and resumed.from_checkpoint.startswith("script:"):
            snap = step_end.get((seg.node, seg.attempt, resumed.step - 1))
        return min(snap, it.onset) if snap is not None else seg.first_start
    safe = seg.first_start
    for c in commits:
        if seg.first_start <= c.ts <= it.detected:
            safe = max(safe, min(snapshot_at[(c.node, c.attempt, c.step)], it.onset))
    return safe


def _cost(it: Interruption, safe: float, nxt: Segment | None, events: Sequence[Event]) -> InterruptionCost:
    root = next(
        (e for e in events if getattr(e, "onset", None) == it.onset and e.kind == "FailureDetected"), None
    )
    recovery = (nxt.first_start - it.detected) if nxt is not None else None
    detection = max(0.0, it.detected - it.onset)
    lost = max(0.0, it.onset - safe)
    return InterruptionCost(
        onset=it.onset,
        detected=it.detected,
        failure=it.failure,
        rank=root.rank if root is not None else -1,
        step=it.step,
        node=it.node,
        component=it.component,
        detection_s=detection,
        lost_work_s=lost,
        lost_since=safe,
        recovery_s=recovery,
        total_s=(lost + detection + recovery) if recovery is not None else None,
    )
