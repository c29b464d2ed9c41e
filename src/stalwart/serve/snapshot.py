"""The observable state of one run at one moment, computed from its ledger events.

Pure: a function of (events, now, model spec). Goodput, badput buckets, interruptions, MTBF and
MTTR come from :mod:`stalwart.account` (the same functions ``stalwart report`` uses), stragglers
from :mod:`stalwart.diagnose.straggler`; this module only groups and labels them for the exporter,
the alerts and the dashboard.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..account.goodput import BUCKETS, InterruptionCost, compute
from ..account.mfu import ModelSpec, mfu_from_step
from ..account.reliability import interruptions_from_events, mtbf, mttr
from ..diagnose.straggler import score_ranks
from ..errors import StalwartError
from ..events import (
    CheckpointCommitted,
    CheckpointLoaded,
    CheckpointRejected,
    CheckpointStaged,
    DecisionTaken,
    Event,
    FailureDetected,
    JobEnded,
    JobStarted,
    ReformedInPlace,
    StepCompleted,
    TrainingResumed,
)
from ..events.node_health import HealthChecked, NodeDrained, NodeResumed, NodeStateChanged
from ..policy import vocabulary as vocab
from ..policy.vocabulary import MEMBERSHIP, NEVER_CHECKED, RecoveryDecision
from ..protocol.step_history import script_resume

RECENT_STEPS = 20  # per-rank window for the "recent step time"
HEATMAP_STEPS = 60  # per-rank step durations kept for the dashboard's heat map
# finding codes exported as hardware signals (joined with step time by the seam alert)
HW_SLOWDOWN_CODES = (
    "gpu.clock.hw_slowdown",
    "gpu.clock.hw_thermal",
    "gpu.clock.power_brake",
    "gpu.clock.sw_thermal",
    "gpu.temp.slowdown",
)
LINK_ERROR_PREFIXES = ("ib.", "gpu.nvlink.", "gpu.pcie.")


# a node's health as the dashboard and ``stalwart_node_state`` show it: the lifecycle's states and
# "unknown" (never checked) before any check
NODE_HEALTH: tuple[str, ...] = (*(str(s) for s in vocab.NodeState), NEVER_CHECKED)


@dataclass(frozen=True)
class RankState:
    rank: int
    node: str
    steps: int
    last_step: int
    last_step_s: float
    recent_step_s: float  # mean of the last RECENT_STEPS steps
    last_ts: float
    straggler_score: float | None
    recent_steps: tuple[tuple[int, float], ...] = ()  # (step, duration) of the last HEATMAP_STEPS


@dataclass(frozen=True)
class NodeState:
    node: str
    state: str  # one of NODE_HEALTH (the lifecycle's state as the ledger wrote it)
    reason: str
    drained: bool
    drain_reason: str
    findings: tuple[dict, ...]
    hw_slowdown: tuple[str, ...]  # subjects with a thermal/power slowdown finding
    link_errors: tuple[str, ...]  # subjects with a link-error finding


@dataclass(frozen=True)
class Checkpoints:
    committed: int
    stall_s: tuple[float, ...]
    persist_s: tuple[float, ...]
    restore_s: tuple[float, ...]
    rejected: int
    newest_step: int
    newest_ts: float | None
    newest_path: str
    # an unchanged script's own resume points (it saves checkpoints Stalwart does not see): one line each
    script_resumes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSnapshot:
    run_id: str
    now: float
    events: int
    started: bool
    finished: bool
    outcome: str = "running"
    verdict: str = ""
    job_start: float = 0.0
    wall_s: float = 0.0
    goodput: float = 0.0
    buckets: dict[str, float] = field(default_factory=dict)
    ideal_step_s: float = 0.0
    steps_completed: int = 0
    interruptions: tuple[dict, ...] = ()
    restarts_by_cause: dict[str, int] = field(default_factory=dict)
    interruptions_by_cause: dict[str, int] = field(default_factory=dict)
    incidents_by_class: dict[str, int] = field(default_factory=dict)
    mtbf_job_hours: float | None = None
    mtbf_gpu_hours: float | None = None
    mttr_s: dict[str, float | None] = field(default_factory=dict)
    ranks: tuple[RankState, ...] = ()
    nodes: tuple[NodeState, ...] = ()
    checkpoints: Checkpoints | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    goodput_series: tuple[tuple[float, float], ...] = ()
    error: str = ""  # why the accounting could not be computed (shown as a banner)


def _ranks(steps: Sequence[StepCompleted]) -> tuple[RankState, ...]:
    by_rank: dict[int, list[StepCompleted]] = {}
    for s in steps:
        by_rank.setdefault(s.rank, []).append(s)
    scores = {r.rank: r.score for r in score_ranks(steps).ranks}
    out = []
    for rank, group in sorted(by_rank.items()):
        recent = [s.duration for s in group[-RECENT_STEPS:]]
        kept = tuple((s.step, s.duration) for s in group[-HEATMAP_STEPS:])
        last = group[-1]
        out.append(
            RankState(
                rank=rank,
                node=last.node,
                steps=len(group),
                last_step=last.step,
                last_step_s=last.duration,
                recent_step_s=statistics.fmean(recent),
                last_ts=last.ts,
                straggler_score=scores.get(rank),
                recent_steps=kept,
            )
        )
    return tuple(out)


def _nodes(events: Sequence[Event]) -> tuple[NodeState, ...]:

    info: dict[str, dict] = {}
    for e in events:
        if not e.node:
            continue
        n = info.setdefault(
            e.node,
            {"state": NEVER_CHECKED, "reason": "", "drained": False, "drain_reason": "", "findings": ()},
        )
        if isinstance(e, NodeStateChanged):
            n["state"], n["reason"] = e.to_state, e.state_reason or e.reason
        elif isinstance(e, NodeDrained):
            n["drained"], n["drain_reason"] = True, e.reason
        elif isinstance(e, NodeResumed):
            n["drained"], n["drain_reason"] = False, ""
        elif isinstance(e, HealthChecked):
            n["findings"] = tuple(e.findings)
            if n["state"] == NEVER_CHECKED:
                n["state"] = vocab.NodeState.HEALTHY if e.status == "pass" else vocab.NodeState.SUSPECT
    out = []
    for node, n in sorted(info.items()):
        fs = n["findings"]
        hw = tuple(sorted({f.get("subject", "") for f in fs if f.get("code") in HW_SLOWDOWN_CODES}))
        link = tuple(
            sorted(
                {
                    f.get("subject", "")
                    for f in fs
                    if str(f.get("code", "")).startswith(LINK_ERROR_PREFIXES)
                    and f.get("severity") in ("warn", "fail")
                }
            )
        )
        out.append(NodeState(node, n["state"], n["reason"], n["drained"], n["drain_reason"], fs, hw, link))
    return tuple(out)


def _checkpoints(events: Sequence[Event]) -> Checkpoints:
    commits = [e for e in events if isinstance(e, CheckpointCommitted) and e.rank <= 0]
    staged = [e for e in events if isinstance(e, CheckpointStaged) and e.rank <= 0]
    loads = [e for e in events if isinstance(e, CheckpointLoaded) and e.rank <= 0]
    staged_keys = {(e.node, e.attempt, e.step) for e in staged}
    stalls = [e.stall_s for e in staged] + [
        c.stall_s for c in commits if (c.node, c.attempt, c.step) not in staged_keys
    ]
    newest = max(commits, key=lambda c: c.ts) if commits else None
    return Checkpoints(
        committed=len(commits),
        stall_s=tuple(stalls),
        persist_s=tuple(c.persist_s for c in commits),
        restore_s=tuple(ld.duration_s for ld in loads),
        rejected=sum(1 for e in events if isinstance(e, CheckpointRejected)),
        newest_step=newest.step if newest else -1,
        newest_ts=newest.ts if newest else None,
        newest_path=newest.path if newest else "",
        script_resumes=tuple(
            f"attempt {e.attempt}: {told[1]}"
            for e in events
            if isinstance(e, TrainingResumed) and (told := script_resume(e.from_checkpoint)) is not None
        ),
    )


def _restarts(events: Sequence[Event]) -> dict[str, int]:
    """Restart decisions, attributed to the failure they answered (``peer_lost`` only if nothing
    else); a restart that answered no failure re-formed the group for a joining node (membership).
    A failure is answered by a restart, a stop, or an in-place recovery that completed; the ladder's
    other records (an in-place rung skipped or failed, observe-only advice) leave it pending."""
    out: dict[str, int] = {}
    pending: list[FailureDetected] = []
    for e in events:
        if isinstance(e, FailureDetected):
            pending.append(e)
        elif isinstance(e, ReformedInPlace):
            pending = []
        elif isinstance(e, DecisionTaken) and e.action in (RecoveryDecision.RESTART, RecoveryDecision.STOP):
            if e.action == RecoveryDecision.RESTART:
                root = next((f for f in pending if f.failure != "peer_lost"), pending[0] if pending else None)
                cause = root.failure if root is not None else MEMBERSHIP
                out[cause] = out.get(cause, 0) + 1
            pending = []
    return out


def take(
    events: Sequence[Event], now: float, *, model: ModelSpec | None = None, series_points: int = 0
) -> RunSnapshot:
    """The snapshot of a run whose merged events (timestamp order) are given."""
    starts = [e for e in events if isinstance(e, JobStarted)]
    run_id = starts[0].run_id if starts else (events[0].run_id if events else "")
    steps = [e for e in events if isinstance(e, StepCompleted)]
    base = RunSnapshot(
        run_id=run_id,
        now=now,
        events=len(events),
        started=bool(starts),
        finished=any(isinstance(e, JobEnded) for e in events),
        ranks=_ranks(steps),
        nodes=_nodes(events),
        checkpoints=_checkpoints(events),
        restarts_by_cause=_restarts(events),
    )
    if not starts:
        return replace(base, error="no JobStarted event yet" if events else "")
    try:
        gp = compute(events)
        rel = gp.reliability or interruptions_from_events(events)
    except StalwartError as exc:
        return replace(base, error=str(exc))
    n = len(rel.interruptions)
    by_cause: dict[str, int] = {}
    by_class: dict[str, int] = {}
    for it in gp.interruptions:
        by_cause[it.failure] = by_cause.get(it.failure, 0) + 1
        by_class[it.component] = by_class.get(it.component, 0) + 1
    rep = mttr(rel.interruptions)
    tokens_per_s = mfu_value = None
    if model is not None and gp.ideal_step_s > 0:
        tokens_per_s = model.tokens_per_step / gp.ideal_step_s
        mfu_value = mfu_from_step(
            model.dims, model.tokens_per_step, gp.ideal_step_s, model.num_gpus, model.peak_flops_per_gpu
        )
    series = goodput_series(events, gp.job_start, gp.job_end, series_points) if series_points else ()
    return replace(
        base,
        outcome=gp.outcome,
        verdict=gp.verdict,
        job_start=gp.job_start,
        wall_s=gp.wall_s,
        goodput=gp.goodput,
        buckets={b: gp.buckets[b] for b in BUCKETS},
        ideal_step_s=gp.ideal_step_s,
        steps_completed=gp.steps_completed,
        interruptions=tuple(_interruption_dict(c) for c in gp.interruptions),
        interruptions_by_cause=by_cause,
        incidents_by_class=by_class,
        mtbf_job_hours=mtbf(n, rel.exposure, "job_hours").value,
        mtbf_gpu_hours=mtbf(n, rel.exposure, "gpu_hours").value,
        mttr_s={
            "detect": rep.detect_s,
            "decide": rep.decide_s,
            "recover": rep.recover_s,
            "total": rep.total_s,
        },
        tokens_per_s=tokens_per_s,
        mfu=mfu_value,
        goodput_series=series,
    )


# Any: a JSON document of any shape (json.dumps)
def _interruption_dict(c: InterruptionCost) -> dict[str, Any]:
    return {
        "onset": c.onset,
        "detected": c.detected,
        "failure": c.failure,
        "rank": c.rank,
        "step": c.step,
        "node": c.node,
        "component": c.component,
        "detection_s": c.detection_s,
        "lost_work_s": c.lost_work_s,
        "recovery_s": c.recovery_s,
        "total_s": c.total_s,
    }


def goodput_series(
    events: Sequence[Event], t0: float, t1: float, points: int
) -> tuple[tuple[float, float], ...]:
    """Cumulative goodput at ``points`` instants between job start and now (the report's function each time).

    Each point is ``compute`` over the events up to that instant, so the last point equals the report.
    """
    if points <= 0 or t1 <= t0:
        return ()
    out = []
    idx = 0
    for i in range(1, points + 1):
        t = t0 + (t1 - t0) * i / points
        while idx < len(events) and events[idx].ts <= t:
            idx += 1
        try:
            out.append((t, compute(events[:idx]).goodput))
        except StalwartError:
            continue
    return tuple(out)
