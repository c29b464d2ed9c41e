"""The agent's monitors: one per concern, each a pure ``(snapshot) -> Decision | None``.

- :func:`worker_exits`: a worker failed (no stop was asked): its root cause, a crash incident;
- :func:`durability`: every worker exited: succeeded, or the final/emergency save's verdict (exit 76
  only for an emergency checkpoint every rank reported committed to a durable tier);
- :class:`SignalMonitor`: a signal to the agent: SIGINT stops, others start a coordinated emergency
  save; then hold, pass the stop on to a script without the SDK, or end at the deadline;
- :class:`HangMonitor`: SDK heartbeats (attribution by :func:`stalwart.diagnose.hang.attribute_hang`)
  or, without the SDK, CPU progress; a hang incident;
- :func:`membership`: a node waits to join: re-form the group;
- :class:`StragglerMonitor`: ranks compared within the same steps, debounced over windows
  (:func:`stalwart.diagnose.straggler.relative_stragglers`); the straggler-action policy's verdict,
  carried out (exclude this node) only when the attempt's precision gate allows.

:data:`PRIORITY` is the order the supervisor asks them in.
"""

from __future__ import annotations

import dataclasses
import signal as _signal
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from typing_extensions import assert_never

from ..diagnose.incident import BlastRadius, Incident
from ..diagnose.precision import GateDecision
from ..diagnose.root_cause import classify, component_class, incident_class
from ..diagnose.straggler import RelativeStraggler, own_work, relative_stragglers
from ..diagnose.straggler_action import (
    StragglerActionConfig,
    StragglerCase,
    StragglerDecision,
    Workload,
    confidence_from_windows,
    decide_straggler,
)
from ..events import StepCompleted
from ..exit_codes import EXIT_PREEMPTED
from ..policy.restart_policy import Failure
from ..policy.timeouts import HangTimeout, HangTimeoutPolicy, hang_timeout
from ..policy.world_size import SizeRule
from .cpu_progress import detect_cpu_stall
from .decision import AttemptOutcome, Decision, StragglerAdvice
from .progress import detect_hang_in, durability_problem_in
from .snapshot import RankView, Snapshot
from .workers import describe_exit

Monitor = Callable[[Snapshot], Decision | None]


class HangSource(str, Enum):
    """What a hang was detected from."""

    HEARTBEAT = "heartbeat"  # the SDK's messages and heartbeats stopped
    CPU = "cpu"  # a script without the SDK stopped using CPU

    def __str__(self) -> str:
        return self.value

    @property
    def confidence(self) -> float:
        match self:
            case HangSource.HEARTBEAT:
                return 0.8
            case HangSource.CPU:
                return 0.6
            case _:
                assert_never(self)


class HangPhase(str, Enum):
    """What the ranks are doing while the hang monitor watches: the silence allowed depends on it."""

    START_UP = "start-up"  # before the first step
    CHECKPOINT = "checkpoint"
    WRAP_UP = "wrap-up"  # past the loop's last step: the script's own code after the loop
    TRAINING = "training"

    def __str__(self) -> str:
        return self.value


# how sure a crash's root cause is, by kind: an error record names the exception; a signal death
# says what killed the rank but not why; a lost peer says the cause is elsewhere
CRASH_CONFIDENCE = {"exception": 0.9, "crash": 0.7, "peer_lost": 0.4}
_KIND_ORDER = {"exception": 0, "crash": 1, "peer_lost": 2}
_CLASS_OF_KIND = {"exception": "user_error", "crash": "crash", "peer_lost": "peer_lost"}


# --- worker exits ---------------------------------------------------------------------------------


def worker_exits(s: Snapshot) -> Decision | None:
    """A rank exited non-zero while no stop was asked: the attempt failed; name the root cause."""
    failed = s.failed
    if not failed or s.stop_requested_at is not None:
        return None
    return crash(s, failed)


def crash(s: Snapshot, failed: dict[int, int]) -> Decision:
    """Root cause among the failed ranks: a user exception first, then a signal death, then a lost
    peer; within a kind the earliest exit."""
    detected = s.now

    def rank_key(r: int) -> tuple[int, float]:
        return _KIND_ORDER[classify(failed[r], s.errors.get(r))], s.exit_times.get(r, detected)

    root = min(failed, key=rank_key)
    code, err = failed[root], s.errors.get(root)
    kind = classify(code, err)
    p = s.progress.get(root) or RankView(root, s.started)
    step = err.step if err is not None and err.step >= 0 else p.step
    # onset: an exception stamps its own time; a signal death happened after the rank's last
    # message and before the agent saw the exit (one tick later at most): take the message
    onset = min(s.exit_times.get(root, detected), detected)
    if err is not None and err.ts > 0:
        onset = min(onset, err.ts)
    elif p.last_msg > s.started:
        onset = min(onset, p.last_msg)
    evidence = describe_exit(code)
    if err is not None:
        evidence += f"; {err.signature}"
    failure = Failure(
        kind=kind,
        attempt=s.attempt,
        step=step,
        rank=root,
        evidence=evidence,
        signature=err.signature if err is not None else "",
        progressed=s.steps_seen,
        sdk=bool(s.sdk_ranks),
    )
    fault_class, component = incident_class(
        component_class(_CLASS_OF_KIND[kind], evidence, err.type if err else "", err.message if err else "")
    )
    if kind == "exception":
        cause = f"rank {root} raised {err.signature if err else evidence}"
    elif kind == "peer_lost":
        cause = f"rank {root} lost a peer ({evidence}); the cause is on another rank or the network"
    else:
        cause = f"rank {root} {evidence}"
    others = sorted(r for r in failed if r != root)
    incident = Incident(
        cause=cause,
        fault_class=fault_class,
        component=component,
        confidence=CRASH_CONFIDENCE[kind],
        action="restart the workers (within the restart budget)",
        ts=detected,
        onset=onset,
        rule="monitor:worker-exits",
        evidence=(f"rank {root}: {evidence}",)
        + tuple(f"rank {r}: {describe_exit(failed[r])}" for r in others)
        + ((f"step {step}",) if step >= 0 else ()),
        blast_radius=BlastRadius(nodes=(s.node,), ranks=(root,)),
    )
    return Decision(
        "crash",
        f"rank {root} {evidence}",
        AttemptOutcome("failed", failure, detected),
        incident,
        rank=root,
        onset=onset,
        exit_code=code,
        error=err,
    )


# --- every worker exited: the verdict rests on what was saved ---------------------------------------


def durability(s: Snapshot) -> Decision | None:
    if not s.all_exited:
        return None
    codes = s.codes
    if s.stop_requested_at is not None or s.preempted_ranks:
        # exit 76 only for an emergency checkpoint every rank saw commit to a durable tier
        why = durability_problem_in(s.durability, "emergency")
        step = max((d.step for d in s.durability.values() if d.kind == "emergency"), default=-1)
        if not why and step < 0:  # exit 76 needs a rank's word that it committed
            why = "no rank reported a committed emergency checkpoint"
        if not why and all(c in (0, EXIT_PREEMPTED) for c in codes.values()):
            return Decision(
                "stopped_exit",
                f"every worker stopped; the emergency checkpoint of step {step} committed",
                AttemptOutcome("preempted", step=step),
            )
        # a failed exit without a stop request was a crash (the exits monitor comes first), so here the
        # workers stopped on a preemption (theirs or ours) without a committed emergency checkpoint
        exits = {c for c in codes.values() if c is not None}  # every worker exited: none is None
        why = why or "workers exited " + ", ".join(describe_exit(c) for c in exits)
        return Decision(
            "stopped_exit",
            f"every worker stopped; the emergency checkpoint did not commit: {why}",
            AttemptOutcome("preempted_unsaved", detail=why, step=step),
        )
    why = durability_problem_in(s.durability, "final")
    if why:  # the training finished but its final state is not safe: say so, never "succeeded"
        return Decision(
            "finished",
            f"every worker finished, but the final state was not committed: {why}",
            AttemptOutcome("final_unsaved", detail=why, step=s.max_done_step + 1),
        )
    return Decision("finished", "every worker finished", AttemptOutcome("succeeded"))


# --- signals to the agent ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalMonitor:
    emergency_deadline_s: float
    no_sdk_after_s: float = 30.0  # a worker silent this long after start does not use the SDK

    def __call__(self, s: Snapshot) -> Decision | None:
        if s.signal is not None and s.stop_requested_at is None:
            name = _signal.Signals(s.signal).name
            if s.signal == _signal.SIGINT:
                return Decision("interrupt", f"{name}: stopping the workers", AttemptOutcome("interrupted"))
            # every rank stops after the same step: two ahead of the most advanced one, or, before any
            # step was seen, after its first step (workers only record signals; the agent coordinates)
            stop = s.max_step_in_progress + 2 if s.steps_seen else 0
            return Decision(
                "request_stop",
                f"{name}: every rank saves an emergency checkpoint and stops after step {stop}",
                stop_step=stop,
            )
        if s.stop_requested_at is None:
            return None
        if not s.sdk_ranks and s.now - s.started >= self.no_sdk_after_s:
            # a script without the SDK: nothing to coordinate, pass the stop on as torchrun does
            return Decision(
                "pass_stop", "no SDK in the script: the stop is passed on", AttemptOutcome("stopped")
            )
        if s.now - s.stop_requested_at > self.emergency_deadline_s:
            saved = [d for d in s.durability.values() if d.kind == "emergency" and d.durable]
            if saved and len(saved) == len(s.ranks):  # every rank had committed; only the exit lagged
                step = max(d.step for d in saved)
                return Decision(
                    "deadline",
                    f"emergency deadline passed after every rank committed step {step}",
                    AttemptOutcome("preempted", step=step),
                )
            detail = f"not every rank finished it within --emergency-deadline {self.emergency_deadline_s:g}s"
            return Decision("deadline", detail, AttemptOutcome("preempted_unsaved", detail=detail))
        return Decision("hold", "waiting for the coordinated emergency checkpoint")


# --- hangs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HangMonitor:
    policy: HangTimeoutPolicy
    startup_timeout_s: float
    cpu_stall_s: float

    def phase(self, s: Snapshot) -> HangPhase:
        if not s.steps_seen:
            return HangPhase.START_UP
        if s.in_checkpoint:
            return HangPhase.CHECKPOINT
        # after the loop the script runs code of its own (saving the model, a last evaluation, tearing
        # down the process group) whose length the step times do not predict: the start-up budget applies
        return HangPhase.WRAP_UP if s.wrapping_up else HangPhase.TRAINING

    def timeout(self, s: Snapshot) -> tuple[HangTimeout, float]:
        """The calibrated hang timeout, and the silence allowed in the snapshot's phase."""
        ht = hang_timeout(s.step_times, self.policy)
        phase = self.phase(s)
        match phase:
            case HangPhase.TRAINING:
                return ht, ht.seconds
            case HangPhase.START_UP | HangPhase.CHECKPOINT | HangPhase.WRAP_UP:
                return ht, max(ht.seconds, self.startup_timeout_s)
            case _:
                assert_never(phase)

    def next_check(self, s: Snapshot) -> float:
        """When the next tick must come so a hang is never declared after its timeout."""
        live = [r.last_msg for r in s.ranks if not r.finished and r.sdk]
        if not s.sdk_ranks or not live:
            return s.now + s.tick
        return min(live) + self.timeout(s)[1] - s.tick

    def __call__(self, s: Snapshot) -> Decision | None:
        # declare the hang up to one tick before the timeout, so that detection never lands after it,
        # whatever the poll phase (the supervisor also sleeps exactly to the deadline)
        if not s.sdk_ranks:
            stall = detect_cpu_stall(s.cpu, s.now + s.tick, self.cpu_stall_s)
            if stall is None:
                return None
            return _hang(
                s,
                stall.culprit,
                stall.onset,
                stall.evidence,
                "no SDK in the script: hang detection by CPU progress",
                -1,
                tuple(sorted(r for r in s.cpu if r != stall.culprit)),
                HangSource.CPU,
            )
        ht, seconds = self.timeout(s)
        v = detect_hang_in(s.ranks, s.now + s.tick, seconds, self.phase(s))
        if v is None:
            return None
        return _hang(s, v.culprit, v.onset, v.evidence, ht.reason, v.step, v.victims, HangSource.HEARTBEAT)


def _hang(
    s: Snapshot,
    culprit: int,
    onset: float,
    evidence: str,
    why: str,
    step: int,
    victims: tuple[int, ...],
    how: HangSource,
) -> Decision:
    failure = Failure(
        kind="hang",
        attempt=s.attempt,
        step=step,
        rank=culprit,
        evidence=evidence,
        progressed=s.steps_seen,
        sdk=bool(s.sdk_ranks),
    )
    fault_class, component = incident_class(component_class("hang", evidence))
    incident = Incident(
        cause=f"rank {culprit} stopped making progress; the other ranks wait for it",
        fault_class=fault_class,
        component=component,
        confidence=how.confidence,
        action="capture stacks and restart the workers (within the restart budget)",
        ts=s.now,
        onset=onset,
        rule=f"monitor:hang-{how}",
        evidence=(evidence, why) + ((f"waiting ranks: {', '.join(map(str, victims))}",) if victims else ()),
        blast_radius=BlastRadius(nodes=(s.node,), ranks=(culprit,)),
    )
    return Decision(
        "hang",
        f"{evidence}; {why}",
        AttemptOutcome("failed", failure, s.now),
        incident,
        rank=culprit,
        onset=onset,
    )


# --- membership --------------------------------------------------------------------------------------


def membership(s: Snapshot) -> Decision | None:
    if not s.nodes_waiting:
        return None
    return Decision("membership", f"{s.nodes_waiting} node(s) waiting to join", AttemptOutcome("membership"))


# --- stragglers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StragglerMonitor:
    """Ranks slower than the others *at the same steps*, in ``k`` of the last ``n`` windows of
    ``window`` steps, so a machine-wide slowdown or one slow window flags nobody.

    With ``action`` set, each new straggler is weighed by the straggler-action policy
    (:func:`stalwart.diagnose.straggler_action.decide_straggler`); ``gate`` (this attempt's
    :func:`~stalwart.diagnose.straggler_action.straggler_gate`) says whether its ``exclude`` is carried
    out. Acting ends the attempt (``exclude_straggler``): this node is quarantined and leaves, the
    others continue without it. Without a gate, or with an observe-only one, it only records."""

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
        cleared = tuple((r, 1.0) for r in sorted(s.stragglers) if r not in slow)
        if not detected and not cleared:
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
                "stragglers",
                rep.reason,
                detected=detected,
                cleared=cleared,
                evidence=rep.reason,
                advice=advice,
            )
        inc = dataclasses.replace(exclude.incident, action_taken=True)
        return Decision(
            "exclude_straggler",
            exclude.reason,
            AttemptOutcome("excluded", detected_at=s.now, detail=exclude.reason),
            inc,
            rank=inc.blast_radius.ranks[0],
            onset=inc.onset,
            detected=detected,
            cleared=cleared,
            evidence=rep.reason,
            advice=advice,
        )

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
        work = Workload(s.world, step_time, remaining, self.min_nodes, self.max_nodes, self.rule)
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


class MonitorSettings(Protocol):
    """What the monitors read from a run's settings (a ``straggler_policy`` is optional)."""

    @property
    def min_nodes(self) -> int: ...

    @property
    def max_nodes(self) -> int: ...

    @property
    def size_rule(self) -> SizeRule: ...

    @property
    def emergency_deadline_s(self) -> float: ...

    @property
    def hang_policy(self) -> HangTimeoutPolicy: ...

    @property
    def startup_timeout_s(self) -> float: ...

    @property
    def cpu_stall_s(self) -> float: ...


def default_monitors(cfg: MonitorSettings, straggler_gate: GateDecision | None = None) -> tuple[Monitor, ...]:
    """The monitors of a run configuration, in :data:`PRIORITY` order; ``straggler_gate``: whether
    this attempt may act on the straggler policy's verdicts (None: observe only)."""
    policy: StragglerActionConfig | None = getattr(cfg, "straggler_policy", None)
    return (
        StragglerMonitor(
            action=policy if policy is not None else StragglerActionConfig.model_validate({}),
            min_nodes=cfg.min_nodes,
            max_nodes=cfg.max_nodes,
            rule=cfg.size_rule,
            gate=straggler_gate,
        ),
        worker_exits,
        durability,
        SignalMonitor(cfg.emergency_deadline_s),
        HangMonitor(cfg.hang_policy, cfg.startup_timeout_s, cfg.cpu_stall_s),
        membership,
    )


# stragglers are observed first (they end a tick only to exclude this node, never with a failed worker
# or a stop under way), then exits before anything a signal or a
# silence could suggest (a worker that exited says more than one that is quiet), then the stop a
# signal asks for (while it runs, hangs and membership wait), then hangs, then a joining node
PRIORITY = ("stragglers", "worker_exits", "durability", "signals", "hangs", "membership")
