"""The straggler monitor: ranks compared within the same steps, debounced over windows
(:func:`stalwart.diagnose.straggler.relative_stragglers`); the straggler-action policy's verdict,
carried out (exclude this node) only when the attempt's precision gate allows. One of the agent's
monitors (``monitors.py``)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from ...diagnose.incident import Incident
from ...diagnose.precision import GateDecision
from ...diagnose.slow_link import SilenceVerdict
from ...diagnose.straggler import RelativeStraggler, own_work, relative_stragglers
from ...diagnose.straggler_action import (
    StragglerActionConfig,
    StragglerCase,
    StragglerDecision,
    Workload,
    confidence_from_windows,
    decide_straggler,
)
from ...events import StepCompleted
from ...policy.job import AttemptStatus
from ...policy.world_size import SizeRule
from ..decision import AttemptOutcome, Decision, DecisionKind, StragglerAdvice
from ..snapshot import Snapshot

# --- stragglers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StragglerMonitor:
    """Ranks slower than the others *at the same steps*, in ``k`` of the last ``n`` windows of
    ``window`` steps, so a machine-wide slowdown or one slow window flags nobody.

    With ``action`` set, each new straggler is weighed by the straggler-action policy
    (:func:`stalwart.diagnose.straggler_action.decide_straggler`); ``gate`` (this attempt's
    :func:`~stalwart.diagnose.straggler_action.straggler_gate`) says whether its ``exclude`` is carried
    out. Acting ends the attempt (``exclude_straggler``): this node is quarantined and leaves, the
    others continue without it; never when its agent serves a store the others need (the snapshot's
    ``hosts``, or the round's store as the group's first node): the policy keeps it, saying so.
    Without a gate, or with an observe-only one, it only records."""

    threshold: float = 1.2
    window: int = 10
    k: int = 3
    n: int = 5
    min_ranks: int = 2
    action: StragglerActionConfig | None = None  # None: detect only; else also weigh excluding the node
    min_nodes: int = 1
    max_nodes: int = 1
    rule: SizeRule = SizeRule()
    gate: GateDecision | None = None  # None: observe only

    @property
    def steps_kept(self) -> int:
        """Steps per rank the supervisor keeps for the monitor (``n`` windows)."""
        return self.window * self.n

    def __call__(self, s: Snapshot) -> Decision | None:
        if s.straggler_step < 0:
            return None
        rep = relative_stragglers(
            s.recent_steps,
            threshold=self.threshold,
            window=self.window,
            k=self.k,
            n=self.n,
            min_ranks=self.min_ranks,
        )
        slow = {r.rank: r.ratio for r in rep.stragglers}
        detected = tuple((r, score) for r, score in sorted(slow.items()) if r not in s.stragglers)
        # a rank flagged while no step could be compared (one rank per host: a slow link's rank) is
        # not cleared by a comparison that did not happen
        cleared = tuple((r, 1.0) for r in sorted(s.stragglers) if r not in slow) if rep.windows else ()
        # ... but by its own steps back at the healthy pace
        cleared += tuple(
            (r, 1.0)
            for r in sorted(s.slow_links)
            if r in s.stragglers and r not in slow and r not in dict(cleared) and self._back(s, r)
        )
        healed = tuple(r for r in sorted(s.slow_links) if r not in s.stragglers and self._back(s, r))
        if not detected and not cleared and not healed:
            return None
        new = {r for r, _ in detected}
        verdicts = [v for v in (self._weigh(s, r) for r in rep.stragglers if r.rank in new) if v is not None]
        acting = self.gate is not None and self.gate.mode == "act"
        # a failed worker or a stop under way comes first: the other monitors own this tick
        busy = bool(s.failed) or s.stop_requested_at is not None
        advice = tuple(self._advice(v, acting and not busy) for v in verdicts)
        exclude = next((a for a in advice if a.action == "exclude_quarantine"), None)
        if exclude is None:
            return Decision(
                DecisionKind.STRAGGLERS,
                rep.reason,
                detected=detected,
                cleared=cleared,
                evidence=rep.reason,
                advice=advice,
                healed=healed,
            )
        inc = dataclasses.replace(exclude.incident, action_taken=True)
        return Decision(
            DecisionKind.EXCLUDE_STRAGGLER,
            exclude.reason,
            AttemptOutcome(
                AttemptStatus.EXCLUDED, detected_at=s.now, detail=f"a straggler ({exclude.reason})"
            ),
            inc,
            rank=inc.blast_radius.ranks[0],
            onset=inc.onset,
            detected=detected,
            cleared=cleared,
            evidence=rep.reason,
            advice=advice,
            healed=healed,
        )

    def slow_link(
        self, s: Snapshot, rank: int, v: SilenceVerdict, incident: Incident, step_time: float
    ) -> Decision:
        """A slow link's verdict as straggler evidence, communication time included: the silent rank is
        flagged with the slowdown of its step so far. On the slow host itself the straggler-action
        policy weighs keeping it, excluding it for a spare or shrinking, by cost, and the gate says
        whether an exclusion is carried out; a witness host only records (it cannot exclude another)."""
        # the slow host's rank is straggler evidence, its step's communication time included; a
        # witness's rank is not slow itself: it records the incident only
        detected = ((rank, round(v.slowdown, 3)),) if v.local else ()
        verdict = None
        if v.local and self.action is not None and s.world is not None and s.world.runnable:
            remaining = max(0, s.total_steps - s.max_done_step - 1) if s.total_steps else 0
            case = StragglerCase(s.node, rank, max(v.slowdown, 1e-9), v.confidence, incident.onset)
            work = Workload(s.world, step_time, remaining, self.min_nodes, self.max_nodes, self.rule, s.hosts)
            verdict = decide_straggler(case, work, s.now, self.action)
        acting = self.gate is not None and self.gate.mode == "act" and not s.failed
        advice = (
            ()
            if verdict is None
            else (self._advice(dataclasses.replace(verdict, incident=incident), acting),)
        )
        if verdict is None or not (acting and verdict.exclude):
            return Decision(
                DecisionKind.STRAGGLERS,
                v.reason,
                incident=incident,
                rank=rank,
                detected=detected,
                evidence=v.reason,
                advice=advice,
            )
        inc = dataclasses.replace(incident, action=f"{verdict.action}: {verdict.reason}", action_taken=True)
        return Decision(
            DecisionKind.EXCLUDE_STRAGGLER,
            f"slow link on {s.node}: {verdict.reason}",
            AttemptOutcome(
                AttemptStatus.EXCLUDED, detected_at=s.now, detail=f"a straggler ({verdict.reason})"
            ),
            inc,
            rank=rank,
            onset=inc.onset,
            detected=detected,
            evidence=v.reason,
            advice=advice,
        )

    def _back(self, s: Snapshot, rank: int) -> bool:
        """A slow link's rank whose newest ``window`` steps all ran at the healthy pace again (within
        ``threshold`` of the attempt's median step time)."""
        mine = sorted((e for e in s.recent_steps if e.rank == rank), key=lambda e: e.step)[-self.window :]
        healthy = statistics.median(s.step_times) if s.step_times else 0.0
        return len(mine) == self.window and all(e.duration <= self.threshold * healthy for e in mine)

    def _advice(self, v: StragglerDecision, acting: bool) -> StragglerAdvice:
        gate = self.gate.reason if self.gate is not None else "observe only"
        if acting:
            return StragglerAdvice(v.action, f"{v.incident.cause}: {v.reason} ({gate})", v.incident)
        return StragglerAdvice(
            f"observe_{v.action}",
            f"{v.incident.cause} (observe only, not acted on: {gate}; {'; '.join(v.incident.evidence)})",
            v.incident,
        )

    def _weigh(self, s: Snapshot, st: RelativeStraggler) -> StragglerDecision | None:
        """The straggler-action policy's verdict on a new straggler."""
        if self.action is None or s.world is None or not s.world.runnable:
            return None
        mine = [e for e in s.recent_steps if e.step >= st.first_step]
        since = min((e.start for e in mine), default=s.now)
        slowdown, step_time = job_slowdown(mine, st.rank)
        if slowdown is None:  # no step with both the straggler and another rank: the detector's ratio
            durations = sorted(e.duration for e in s.recent_steps)
            slowdown, step_time = st.ratio, durations[len(durations) // 2] if durations else 0.0
        remaining = max(0, s.total_steps - s.max_done_step - 1) if s.total_steps else 0
        case = StragglerCase(
            node=s.node,
            rank=st.rank,
            slowdown=max(slowdown, 1e-9),
            confidence=confidence_from_windows(st.flagged, st.seen, self.k),
            since=since,
        )
        work = Workload(s.world, step_time, remaining, self.min_nodes, self.max_nodes, self.rule, s.hosts)
        return decide_straggler(case, work, s.now, self.action)


def job_slowdown(steps: Iterable[StepCompleted], rank: int) -> tuple[float | None, float]:
    """How much slower the job runs because of ``rank``, and its step time without it (pure).

    Per step: the job's step time is its slowest rank's (every rank waits for it in the collective);
    without the straggler it would be shorter by the straggler's extra own work over the others'
    median. The medians over the steps; ``(None, 0.0)`` when no step has the straggler and another
    rank."""
    by_step: dict[int, dict[int, StepCompleted]] = {}
    for e in steps:
        by_step.setdefault(e.step, {})[e.rank] = e
    ratios: list[float] = []
    healthy: list[float] = []
    for per in by_step.values():
        me = per.get(rank)
        others = [own_work(e) for r, e in per.items() if r != rank]
        if me is None or not others:
            continue
        job = max(e.duration for e in per.values())
        without = job - max(0.0, own_work(me) - statistics.median(others))
        if without > 0:
            ratios.append(job / without)
            healthy.append(without)
    if not ratios:
        return None, 0.0
    return statistics.median(ratios), statistics.median(healthy)
