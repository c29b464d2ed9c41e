"""Fit a measured run: failure rates per node-hour by class (with exact Poisson confidence bounds),
detection per class, recovery (overall and per recovery path), checkpoint stall, restore and
interval, step time.

Recovery by path: each restart's path as the agent recorded it (``account/recovery.py``: ``warm``
when the workers were forked from standbys, ``cold`` when spawned afresh, ``mixed`` when the nodes
disagreed, ``unknown`` when the ledger has no start record), marked ``+peer`` when the new attempt
loaded state from a peer node's memory (a ``CheckpointLoaded`` of tier ``peer``), with the mean of its
phases from the restart decision to every rank's first step (re-form, load, first step), and how
often each path was taken.

Failure classes are split by mechanism: the failures of one kind that were recovered in place (the
survivors kept their processes and live state, only the failed ranks were replaced) form a class of
their own (``crash (in place)``), which the replay never rolls back to the checkpoint. Every class
keeps its own rate, detection and mean recovery (detected -> the first step after it, the decision
included); the replay's recovery of a failure is its class's.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..account.goodput import Segment
from ..account.goodput import compute as goodput_of
from ..account.recovery import IN_PLACE, recoveries, recovery_per_interruption
from ..account.reliability import Interruption, interruptions_from_events
from ..errors import ConfigError, LedgerError
from ..events import (
    AttemptStarted,
    ChaosInjected,
    CheckpointCommitted,
    CheckpointLoaded,
    CheckpointStaged,
    Event,
    StepCompleted,
)
from ..policy.vocabulary import FailureKind
from .config import SimConfig
from .units import duration

NODE_LOSING = (FailureKind.AGENT_LOST,)  # the node itself went away: a spare or a repaired node is needed
HANGS = (FailureKind.HANG,)
CONFIDENCE = 0.95


def _gamma_cdf(shape: int, x: float) -> float:
    """P(Gamma(shape, 1) <= x) for a positive integer shape (= P(Poisson(x) >= shape))."""
    if x <= 0:
        return 0.0
    term = math.exp(-x)
    total = term
    for i in range(1, shape):
        term *= x / i
        total += term
    return max(0.0, min(1.0, 1.0 - total))


def _gamma_quantile(shape: int, p: float) -> float:
    lo, hi = 0.0, max(10.0, 4.0 * shape + 40.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _gamma_cdf(shape, mid) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def poisson_interval(count: int, exposure: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact two-sided interval for a Poisson rate (events per unit of ``exposure``)."""
    if exposure <= 0:
        raise ValueError("exposure must be positive")
    a = (1.0 - confidence) / 2.0
    low = 0.0 if count == 0 else _gamma_quantile(count, a) / exposure
    high = _gamma_quantile(count + 1, 1.0 - a) / exposure
    return low, high


@dataclass(frozen=True)
class ClassFit:
    name: str  # the failure kind as the agent detected it: crash, hang, agent_lost, peer_lost
    events: int
    per_node_hour: float
    low: float
    high: float
    detect_s: float
    node_loss: bool
    hang: bool
    in_place: bool = False  # recovered in place: the survivors kept the live state, nothing rolled back
    restart_s: float | None = None  # mean, detected -> first step after the recovery; None: none recovered


RECOVER_PHASES = ("re_form", "load", "first_step")  # the restart decision -> every rank's first step


@dataclass(frozen=True)
class PathFit:
    """The recoveries that took one path: how many, and their mean time and phases (seconds)."""

    path: str  # warm | cold | mixed | unknown (no start record), + "+peer" when state came from a peer
    count: int
    recover_s: float  # mean: the restart decision -> every rank's first step of the new attempt
    phases: dict[str, float]  # mean per phase of RECOVER_PHASES


def recovery_paths(events: Sequence[Event]) -> tuple[PathFit, ...]:
    """Recoveries grouped by path (most frequent first); a recovery with a phase missing (no SDK, or
    the run ended before its first step) is left out, since its time is not known."""
    # the attempt after a restart decision is the next one (the agent counts attempts up by one)
    from_peer = {e.attempt for e in events if isinstance(e, CheckpointLoaded) and e.tier == "peer"}
    groups: dict[str, list[dict[str, float]]] = {}
    for r in recoveries(list(events)):
        phases = {p: r.phases.get(p) for p in RECOVER_PHASES}
        if any(v is None for v in phases.values()):
            continue
        path = (r.path or "unknown") + ("+peer" if r.attempt + 1 in from_peer else "")
        groups.setdefault(path, []).append({p: float(v or 0.0) for p, v in phases.items()})
    fits = [
        PathFit(
            path=path,
            count=len(rows),
            recover_s=statistics.fmean(sum(row.values()) for row in rows),
            phases={p: statistics.fmean(row[p] for row in rows) for p in RECOVER_PHASES},
        )
        for path, rows in groups.items()
    ]
    return tuple(sorted(fits, key=lambda f: (-f.count, f.path)))


def mix_weighted_recover_s(paths: Sequence[PathFit]) -> float | None:
    """The mean recovery over every path, each weighted by how often it was taken."""
    n = sum(p.count for p in paths)
    return sum(p.recover_s * p.count for p in paths) / n if n else None


@dataclass(frozen=True)
class RunFit:
    classes: tuple[ClassFit, ...]
    node_hours: float  # exposure: wall time, or training time when chaos injected the faults
    wall_s: float
    gpus: int
    gpus_per_node: int
    injected: int  # faults that chaos injected
    decide_s: float | None
    recover_s: float | None  # decision -> first step of the new attempt (restore included)
    startup_s: float | None  # job start -> first step
    stall_s: float | None
    restore_s: float | None
    interval_s: float | None  # training seconds between checkpoints
    persist_s: float  # snapshot -> restorable: committed in the tier restarts read from (0: synchronous)
    step_s: float | None
    goodput: float  # as the report measures it
    buckets: dict[str, float]
    recover_paths: tuple[PathFit, ...] = ()  # recovery per path (warm, cold, ...), most frequent first
    slow_steps: float = 0.0  # surviving steps' time beyond the ideal step, as a share of productive
    resume_s: float | None = None  # mean: the restart decision -> the first step's start (training again)

    @property
    def failures(self) -> int:
        return sum(c.events for c in self.classes)

    @property
    def per_node_hour(self) -> tuple[float, float, float]:
        n = self.failures
        low, high = poisson_interval(n, self.node_hours)
        return n / self.node_hours, low, high


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _training_s(segments: Sequence[Segment], onsets: Sequence[float]) -> float:
    """Seconds at risk of a chaos fault: each attempt from its first step's start until the fault that
    ended it (its onset: the step it struck, after any save that followed the last completed step),
    or its last step's end. The simulator's failures strike anywhere in that time."""
    segs = sorted(segments, key=lambda x: x.first_start)
    total = 0.0
    for i, seg in enumerate(segs):
        nxt = segs[i + 1].first_start if i + 1 < len(segs) else math.inf
        ends = [t for t in onsets if seg.last_end <= t < nxt]
        total += (min(ends) if ends else seg.last_end) - seg.first_start
    return total


def _until_training(group: Sequence[Interruption], first_steps: dict[float, float]) -> list[float]:
    """Per recovered interruption: its decision -> the start of the first step after the recovery.
    An interruption's ``recover_s`` runs to that step's end (fault to first productive step, the MTTR
    the report shows); the report books that step as training, so a replay that restarted for the
    whole ``recover_s`` and then trained would count it twice (~one step per failure)."""
    return [
        max(0.0, i.recover_s - first_steps.get(i.recovered or 0.0, 0.0))
        for i in group
        if i.recover_s is not None
    ]


def _restart_s(group: Sequence[Interruption], first_steps: dict[float, float]) -> float | None:
    """The mean time from detection until training resumes after the recovery (the decision booked
    into it, as the report does); None when no failure of ``group`` was recovered."""
    recovers = _until_training(group, first_steps)
    if not recovers:
        return None
    decides = [i.decide_s for i in group if i.decide_s is not None]
    return (statistics.fmean(decides) if decides else 0.0) + statistics.fmean(recovers)


def fit_run(events: Sequence[Event]) -> RunFit:
    run = interruptions_from_events(events)
    if run.exposure.node_hours <= 0:
        raise LedgerError(
            "the ledger has no attempt with a world size, so there is no exposure to measure rates over",
            "point at the run directory of a run that started workers",
        )
    stamps = [e.ts for e in events]
    if stamps and max(stamps) > 1e11:
        raise LedgerError(
            "the ledger's timestamps look like milliseconds, not seconds since the epoch",
            "write events with ts in seconds",
        )
    # each interruption paired with whether it was recovered in place (the same grouping, in order)
    paths = [r.path if r is not None else "" for r in recovery_per_interruption(list(events))]
    placed = [(i, p == IN_PLACE) for i, p in zip(run.interruptions, paths, strict=True)]
    faults = [i for i, _ in placed]
    kinds = sorted({(i.failure, in_place) for i, in_place in placed})
    first_steps = {e.ts: e.duration for e in events if isinstance(e, StepCompleted)}
    g = goodput_of(events)
    attempts = [e for e in events if isinstance(e, AttemptStarted)]
    nodes = max(max(1, a.num_nodes) for a in attempts)
    injected = sum(1 for e in events if isinstance(e, ChaosInjected))
    # chaos fires at steps: its faults are a rate per hour of training, not of wall time
    exposure = run.exposure.node_hours
    if injected:
        exposure = nodes * _training_s(g.segments, [i.onset for i in faults]) / 3600.0
        if exposure <= 0:
            raise LedgerError("the run never trained, so there is no exposure to measure rates over")
    classes = []
    for k, in_place in kinds:
        group = [i for i, p in placed if (i.failure, p) == (k, in_place)]
        low, high = poisson_interval(len(group), exposure)
        classes.append(
            ClassFit(
                name=f"{k} (in place)" if in_place else k,
                events=len(group),
                per_node_hour=len(group) / exposure,
                low=low,
                high=high,
                detect_s=statistics.fmean(i.detect_s for i in group),
                node_loss=k in NODE_LOSING,
                hang=k in HANGS,
                in_place=in_place,
                restart_s=_restart_s(group, first_steps),
            )
        )
    gpus = max(a.world_size for a in attempts)
    decides = [i.decide_s for i in faults if i.decide_s is not None]
    recovers = [i.recover_s for i in faults if i.recover_s is not None]
    resumes = _until_training(faults, first_steps)
    commits = [e for e in events if isinstance(e, CheckpointCommitted) and e.rank <= 0 and not e.emergency]
    staged = [e for e in events if isinstance(e, CheckpointStaged) and e.rank <= 0]
    # the stall of one checkpoint: every tier's stall at that step (staging, else a synchronous save)
    per_ckpt: dict[tuple[str, int, int], float] = {}
    for e in staged or commits:
        key = (e.node, e.attempt, e.step)
        per_ckpt[key] = per_ckpt.get(key, 0.0) + e.stall_s
    stalls = list(per_ckpt.values())
    loaded = [e for e in events if isinstance(e, CheckpointLoaded) and e.rank <= 0]
    persist = _persist_s(staged, commits, loaded)
    loads = [e.duration_s for e in loaded]
    steps = [e for e in events if isinstance(e, StepCompleted) and e.rank <= 0]
    step_s = _median([s.duration for s in steps])
    # the interval in training seconds: steps between consecutive checkpoints x the median step
    ckpt_steps = sorted({k[2] for k in per_ckpt})
    gaps = [b - a for a, b in zip(ckpt_steps, ckpt_steps[1:], strict=False) if b > a]
    gap = _median(gaps)
    # the report books a surviving step's time beyond its ideal as slowdown: steps that slow throughout
    # the run, so every training second of the replay is that much slower (and so is its interval)
    productive = g.buckets.get("productive", 0.0)
    slow = g.buckets.get("straggler_slowdown", 0.0) / productive if productive > 0 else 0.0
    interval = gap * step_s * (1.0 + slow) if gap is not None and step_s else None
    first = min((s.start for s in steps), default=None)
    return RunFit(
        classes=tuple(classes),
        node_hours=exposure,
        wall_s=g.wall_s,
        gpus=gpus,
        gpus_per_node=max(1, gpus // nodes),
        injected=injected,
        decide_s=statistics.fmean(decides) if decides else None,
        recover_s=statistics.fmean(recovers) if recovers else None,
        resume_s=statistics.fmean(resumes) if resumes else None,
        startup_s=(first - g.job_start) if first is not None else None,
        stall_s=statistics.fmean(stalls) if stalls else None,
        restore_s=statistics.fmean(loads) if loads else None,
        interval_s=interval,
        persist_s=persist,
        step_s=step_s,
        goodput=g.goodput,
        buckets=dict(g.buckets),
        recover_paths=recovery_paths(events),
        slow_steps=slow,
    )


def _persist_s(
    staged: Sequence[CheckpointStaged],
    commits: Sequence[CheckpointCommitted],
    loaded: Sequence[CheckpointLoaded],
) -> float:
    """How long after its snapshot (end of staging) a checkpoint can be restored from: its commit in
    the tier the run's restarts read from most (the node memory tier when it has one: a restart
    never waits for the copy on storage), else in its last tier; 0 for synchronous saves."""
    tiers = Counter(e.tier for e in loaded if e.tier)
    restored = tiers.most_common(1)[0][0] if tiers else None
    snap = {(e.node, e.attempt, e.step): e.ts for e in staged}
    done: dict[tuple[str, int, int], float] = {}
    first: dict[tuple[str, int, int], float] = {}
    for c in commits:
        key = (c.node, c.attempt, c.step)
        if key not in snap:
            continue
        if c.tier == restored:
            first[key] = c.ts - snap[key]
        done[key] = max(done.get(key, 0.0), c.ts - snap[key])
    use = first or done
    return statistics.fmean(use.values()) if use else 0.0


def sim_failures(fit: RunFit, *, hang_by_timeout: bool = False) -> list[dict[str, object]]:
    """The fitted classes as simulator failure classes (rates per 1000 GPU-days)."""
    per_gpu = 24.0 * 1000.0 / fit.gpus_per_node  # per node-hour -> per 1000 GPU-days
    return [
        {
            "name": c.name,
            "per_1000_gpu_days": c.per_node_hour * per_gpu,
            "node_loss": c.node_loss,
            "detect_s": c.detect_s,
            "kind": "hang" if c.hang and hang_by_timeout else "crash",
            "in_place": c.in_place,
            "restart_s": c.restart_s,
        }
        for c in fit.classes
    ]


def run_config(fit: RunFit, base: dict[str, object], trials: int = 200) -> dict[str, object]:
    """Simulator settings that replay the measured run: its size, length, rates and times."""
    values = dict(base)
    interval = fit.interval_s if fit.interval_s and fit.interval_s > 0 else fit.wall_s
    values.update(
        gpus=fit.gpus,
        gpus_per_node=fit.gpus_per_node,
        days=max(fit.wall_s - fit.buckets.get("shutdown", 0.0), 1.0) / 86400.0,
        trials=trials,
        failures=sim_failures(fit),
        planned_per_1000_gpu_days=0.0,
        # the report books the decision into restart (detected -> next first step), so does the replay
        decide_s=0.0,
        job_restart_s=(fit.decide_s or 0.0)
        + (fit.resume_s if fit.resume_s is not None else _seconds(values.get("job_restart_s"), 300.0)),
        startup_s=fit.startup_s,
        fail_in_recovery=not fit.injected,
        fail_in_save=not fit.injected,
        spare_nodes=None,
        slow_steps=fit.slow_steps,
        tiers=[
            {
                "name": "measured",
                "interval_s": min(interval, max(fit.wall_s - fit.buckets.get("shutdown", 0.0), 1.0)),
                "stall_s": fit.stall_s or 0.0,
                "restore_s": 0.0 if fit.recover_s is not None else (fit.restore_s or 0.0),
                "persist_s": fit.persist_s,
            }
        ],
    )
    return values


def _seconds(value: object, default: float) -> float:
    """A number of seconds from the caller's settings (a number or its text), or ``default``."""
    if value is None:
        return default
    if isinstance(value, int | float | str):
        return float(value)
    raise ConfigError(f"job_restart_s must be a number of seconds, not {value!r}")


def check_feasible(cfg: SimConfig, source: str) -> None:
    """Refuse rates under which the job could never run: a failure expected sooner than the time one
    failure takes to detect and recover from."""
    lam = cfg.failure_rate_per_s()
    if lam <= 0 or not cfg.fail_in_recovery:  # failures only while training: every recovery finishes
        return
    total = sum(f.per_1000_gpu_days for f in cfg.failures)
    det = sum(f.per_1000_gpu_days * f.detect_s for f in cfg.failures) / total
    restart = (
        sum(
            f.per_1000_gpu_days * (cfg.job_restart_s if f.restart_s is None else f.restart_s)
            for f in cfg.failures
        )
        / total
    )
    down = det + cfg.decide_s + restart + min(t.restore_s for t in cfg.tiers)
    if lam * down >= 1.0:
        raise ConfigError(
            f"at {cfg.gpus:,} GPUs the {source} rate means a failure every {duration(1.0 / lam)}, sooner "
            f"than the {duration(down)} each one takes to detect and recover from: the job would never "
            "make progress",
            "plan a smaller --gpus, or check that the failure rates are real (per 1000 GPU-days) and "
            "not injected",
        )
