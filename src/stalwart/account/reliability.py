"""Reliability accounting: MTBF, MTTR (detect / decide / recover), failure rates, lemon nodes.

Every MTBF says what it is measured in: ``gpu_hours`` (exposure = GPUs x hours; comparable across
job sizes) or ``job_hours`` (job wall-clock hours; what a job of *this* size sees). Rates are given
per node-day and per 1000 GPU-days. Inputs are plain frozen dataclasses; :func:`interruptions_from_events`
builds them from ledger events, so the same numbers come out of the library, the CLI and ``--json``.

Lemon-node scoring: a node's failure count is compared with a Poisson distribution whose mean is the
fleet's rate times that node's exposure; the score is the upper-tail probability ``P(X >= k)``, and a
node is a lemon when that probability is below ``alpha / number_of_nodes`` (Bonferroni) and it failed
at least ``min_failures`` times.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..diagnose.lemon import NodeScore, lemon_scores, poisson_sf  # noqa: F401 - re-exported
from ..diagnose.pipeline import interruptions as failure_groups
from ..diagnose.root_cause import component_class
from ..errors import ConfigError, LedgerError
from ..events import (
    AttemptStarted,
    DecisionTaken,
    Event,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from .recovery import Recovery, recovery_per_interruption


@dataclass(frozen=True)
class Interruption:
    """One interruption of a job: times are seconds since the epoch; ``None`` when not reached."""

    onset: float
    detected: float
    decided: float | None = None
    recovered: float | None = None
    node: str = ""
    component: str = "unknown"
    gpus: int = 0
    failure: str = ""
    step: int = -1
    run_id: str = ""

    @property
    def detect_s(self) -> float:
        return max(0.0, self.detected - self.onset)

    @property
    def decide_s(self) -> float | None:
        return None if self.decided is None else max(0.0, self.decided - self.detected)

    @property
    def recover_s(self) -> float | None:
        if self.recovered is None:
            return None
        return max(0.0, self.recovered - (self.decided if self.decided is not None else self.detected))

    @property
    def downtime_s(self) -> float | None:
        return None if self.recovered is None else max(0.0, self.recovered - self.onset)


@dataclass(frozen=True)
class Exposure:
    """How much was at risk: job wall-clock hours, GPU-hours and node-hours."""

    job_hours: float
    gpu_hours: float
    node_hours: float

    def __post_init__(self) -> None:
        for name in ("job_hours", "gpu_hours", "node_hours"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"exposure {name} must be a finite non-negative number, got {v!r}")


@dataclass(frozen=True)
class Mtbf:
    value: float | None  # None when there were no failures (unbounded)
    unit: str  # "gpu_hours" | "job_hours"
    failures: int

    def label(self) -> str:
        if self.value is None:
            return f"no failures in the exposure ({self.unit.replace('_', '-')})"
        return f"{self.value:,.1f} {self.unit.replace('_', '-')}"


def mtbf(failures: int, exposure: Exposure, unit: str = "gpu_hours") -> Mtbf:
    """MTBF = exposure / failures, in ``gpu_hours`` or ``job_hours`` (wall clock of the job)."""
    if failures < 0:
        raise ConfigError(f"failure count must be non-negative, got {failures}")
    if unit not in ("gpu_hours", "job_hours"):
        raise ConfigError(f"unknown MTBF unit {unit!r}", "use gpu_hours or job_hours")
    total = exposure.gpu_hours if unit == "gpu_hours" else exposure.job_hours
    return Mtbf(value=total / failures if failures else None, unit=unit, failures=failures)


@dataclass(frozen=True)
class Rates:
    failures: int
    per_node_day: float
    per_1000_gpu_days: float


def failure_rates(failures: int, exposure: Exposure) -> Rates:
    if failures < 0:
        raise ConfigError(f"failure count must be non-negative, got {failures}")
    if exposure.node_hours <= 0 or exposure.gpu_hours <= 0:
        raise ConfigError(
            "exposure is zero: no node-hours or GPU-hours to divide by",
            "the ledger holds no attempt with a known world size",
        )
    return Rates(
        failures=failures,
        per_node_day=failures / (exposure.node_hours / 24.0),
        per_1000_gpu_days=1000.0 * failures / (exposure.gpu_hours / 24.0),
    )


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


@dataclass(frozen=True)
class Mttr:
    """Mean time to repair, split into its phases (seconds); ``None`` when nothing was measured."""

    detect_s: float | None
    decide_s: float | None
    recover_s: float | None
    total_s: float | None
    recovered: int
    unrecovered: int


def mttr(interruptions: Sequence[Interruption]) -> Mttr:
    return Mttr(
        detect_s=_mean(i.detect_s for i in interruptions),
        decide_s=_mean(i.decide_s for i in interruptions),
        recover_s=_mean(i.recover_s for i in interruptions),
        total_s=_mean(i.downtime_s for i in interruptions),
        recovered=sum(1 for i in interruptions if i.recovered is not None),
        unrecovered=sum(1 for i in interruptions if i.recovered is None),
    )


def by_component(interruptions: Sequence[Interruption], exposure: Exposure) -> dict[str, Rates]:
    """Failure rates per component class over the same exposure."""
    counts: dict[str, int] = {}
    for i in interruptions:
        counts[i.component] = counts.get(i.component, 0) + 1
    return {c: failure_rates(n, exposure) for c, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def one_fault_across_hosts(groups: list[list[FailureDetected]]) -> list[list[FailureDetected]]:
    out: list[list[FailureDetected]] = []
    for g in groups:
        if out:
            prev = out[-1]
            seen_on = {f.node for f in prev}
            if all(f.node not in seen_on for f in g) and min(f.onset for f in g) <= min(f.ts for f in prev):
                out[-1] = prev + g
                continue
        out.append(g)
    return out


# --- from ledger events ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunReliability:
    interruptions: tuple[Interruption, ...]
    exposure: Exposure
    node_days: Mapping[str, float] = field(default_factory=dict)
    # each interruption's recovery record, in the same order (None: not recovered); read once here
    # and shared by every reader of the run (report, snapshot), so the two tables tell one measurement
    recoveries: tuple[Recovery | None, ...] = ()

    @property
    def recovered(self) -> list[Recovery]:
        """The recovery records of the interruptions that were recovered, in order."""
        return [r for r in self.recoveries if r is not None]


def interruptions_from_events(events: Sequence[Event]) -> RunReliability:
    """Group FailureDetected events into interruptions and measure the exposure of one run.

    Failures detected before the next decision belong to one interruption (several ranks report the
    same fault); the earliest onset wins, and a root cause beats ``peer_lost``. A host that notices
    later, after another host's decision, joins that interruption when none of its failures is on
    a host already in it and its onset is no later than the interruption's first detection: it saw
    the same fault from the other side (a partition noticed late by the cut-off host). ``decided`` is the
    first DecisionTaken after detection; ``recovered`` is where the interruption's recovery record
    (:mod:`.recovery`) ends, every rank stepping again; without one, when every rank completed a step
    after the next TrainingResumed (or the TrainingResumed itself when no step followed). GPUs = world size of the
    attempt in force at the onset.
    """
    evs = sorted(events, key=lambda e: e.ts)
    if not evs:
        raise LedgerError("the ledger holds no events", "point at the run directory of a run that started")
    attempts = [e for e in evs if isinstance(e, AttemptStarted)]
    starts = [e.ts for e in evs if isinstance(e, JobStarted)]
    ends = [e.ts for e in evs if isinstance(e, JobEnded)]
    t0 = min(starts) if starts else evs[0].ts
    t1 = max(ends) if ends else evs[-1].ts

    def world_at(ts: float) -> tuple[int, int]:
        cur = (0, 0)
        for a in attempts:
            if a.ts <= ts:
                cur = (a.world_size, max(1, a.num_nodes))
        return (
            cur if cur != (0, 0) or not attempts else (attempts[0].world_size, max(1, attempts[0].num_nodes))
        )

    groups = one_fault_across_hosts(failure_groups(evs))
    # each interruption's recovery record (the same grouping, paired): where it saw every rank step
    # again, the MTTR ends there too, so the two tell one measurement
    records = recovery_per_interruption(evs)

    out = []
    for g, record in zip(groups, records, strict=True):
        root = next((f for f in g if f.failure != "peer_lost"), g[0])
        onset = min(f.onset for f in g)
        detected = min(f.ts for f in g)
        decided = next(
            (
                e.ts
                for e in evs
                if isinstance(e, DecisionTaken) and not e.action.startswith("observe_") and e.ts >= detected
            ),
            None,
        )
        recovered = None
        after = decided if decided is not None else detected
        resumed = next((e for e in evs if isinstance(e, TrainingResumed) and e.ts >= after), None)
        if resumed is not None:
            nxt_fail = next(
                (e.ts for e in evs if isinstance(e, FailureDetected) and e.ts > resumed.ts), math.inf
            )
            # every rank stepped again: each rank's first step after resuming, the last of them (the
            # recovery table's end, so its total and the MTTR tell one measurement)
            firsts: dict[int, float] = {}
            for e in evs:
                if isinstance(e, StepCompleted) and resumed.ts <= e.ts < nxt_fail:
                    firsts.setdefault(e.rank, e.ts)
            recovered = max(firsts.values()) if firsts else resumed.ts
        if record is not None and record.ended is not None:
            recovered = max(record.ended, after)
        gpus, _ = world_at(onset)
        out.append(
            Interruption(
                onset=onset,
                detected=detected,
                decided=decided,
                recovered=recovered,
                node=root.node,
                component=component_class(root.failure, root.evidence, root.error_type, root.error_message),
                gpus=gpus,
                failure=root.failure,
                step=root.step,
                run_id=root.run_id,
            )
        )

    # exposure: piecewise over attempts (an attempt lasts until the next one or the end of the job);
    # agents on several nodes each write AttemptStarted for the same attempt number: group by it
    by_attempt: dict[tuple[str, int], list[AttemptStarted]] = {}
    for a in attempts:
        by_attempt.setdefault((a.run_id, a.attempt), []).append(a)
    spans = sorted(((min(a.ts for a in grp), grp) for grp in by_attempt.values()), key=lambda t: t[0])
    gpu_h = node_h = 0.0
    node_days: dict[str, float] = {}
    for idx, (ts, grp) in enumerate(spans):
        end = spans[idx + 1][0] if idx + 1 < len(spans) else t1
        hours = max(0.0, end - ts) / 3600.0
        gpu_h += max(a.world_size for a in grp) * hours
        node_h += max(max(1, a.num_nodes) for a in grp) * hours
        for node in {a.node for a in grp if a.node}:
            node_days[node] = node_days.get(node, 0.0) + hours / 24.0
    return RunReliability(
        tuple(out),
        Exposure(job_hours=max(0.0, t1 - t0) / 3600.0, gpu_hours=gpu_h, node_hours=node_h),
        node_days,
        tuple(records),
    )
