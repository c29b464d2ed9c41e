"""The agent's monitors: one per concern, each a pure ``(snapshot) -> Decision | None``.

- :func:`worker_exits`: a worker failed (no stop was asked): its root cause, a crash incident;
- :func:`durability`: every worker exited: succeeded, or the final/emergency save's verdict (exit 76
  only for an emergency checkpoint every rank reported committed to a durable tier);
- :class:`SignalMonitor`: a signal to the agent: SIGINT stops, others start a coordinated emergency
  save; then hold, pass the stop on to a script without the SDK, or end at the deadline;
- :class:`HangMonitor` (``hang_monitor.py``): SDK heartbeats (attribution by
  :func:`stalwart.diagnose.hang.attribute_hang`) or, without the SDK, CPU progress; a hang incident;
- :func:`store_lost`: the rendezvous store stayed silent over the store timeout (read off the tick by
  launch/rendezvous/store_watch.py): stop the group; the job policy ends the job (exit 75);
- :func:`membership`: a node waits to join: re-form the group;
- :class:`StragglerMonitor` (``straggler_monitor.py``): ranks compared within the same steps, debounced over windows
  (:func:`stalwart.diagnose.straggler.relative_stragglers`); the straggler-action policy's verdict,
  carried out (exclude this node) only when the attempt's precision gate allows.

:data:`PRIORITY` is the order the supervisor asks them in; :func:`decide` asks them in that order.
"""

from __future__ import annotations

import dataclasses
import signal as _signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...diagnose.incident import BlastRadius, Incident, lost_host
from ...diagnose.precision import GateDecision
from ...diagnose.root_cause import classify, component_class, incident_class
from ...diagnose.straggler_action import StragglerActionConfig
from ...exit_codes import EXIT_PREEMPTED
from ...policy.job import AttemptStatus
from ...policy.restart_policy import Failure
from ...policy.timeouts import HangTimeoutPolicy
from ...policy.vocabulary import FailureKind
from ...policy.world_size import SizeRule
from ...protocol import DEFAULT_PG_TIMEOUT_S
from ...settings.schema import DiagnosisSettings, WorkerSettings
from ..decision import AttemptOutcome, Decision, DecisionKind
from ..finish_exit import FinishedNotExited
from ..inplace.nodes import RecoverySettings
from ..processes.worker_group import describe_exit
from ..progress import durability_problem_in
from ..snapshot import RankView, Snapshot
from .forwarded_stop import ForwardedStop
from .hang_monitor import HangMonitor, HangPhase, HangSource
from .straggler_monitor import StragglerMonitor, job_slowdown

__all__ = [
    "PRIORITY",
    "HangMonitor",
    "HangPhase",
    "HangSource",
    "Monitor",
    "MonitorSettings",
    "SupervisorSettings",
    "SignalMonitor",
    "StragglerMonitor",
    "crash",
    "decide",
    "default_monitors",
    "durability",
    "job_slowdown",
    "membership",
    "store_lost",
    "worker_exits",
]

Monitor = Callable[[Snapshot], Decision | None]

# how sure a crash's root cause is, by kind: an error record names the exception; a signal death
# says what killed the rank but not why; a lost peer says the cause is elsewhere
CRASH_CONFIDENCE = {"exception": 0.9, "crash": 0.7, "peer_lost": 0.4}
_KIND_ORDER = {"exception": 0, "crash": 1, "peer_lost": 2}


# --- worker exits ---------------------------------------------------------------------------------


def worker_exits(s: Snapshot) -> Decision | None:
    """A rank exited non-zero while no stop was asked: the attempt failed; name the root cause. Not
    when every failed rank was killed by the signal the agent has to act on: a Ctrl-C (a scheduler's
    signal) reaches the whole process group, and workers it killed first are its doing, which the
    signal monitors after this one answer, not a crash to restart from."""
    failed = s.failed
    if not failed or s.stop_requested_at is not None:
        return None
    if s.signal is not None and all(code == -s.signal for code in failed.values()):
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
    kind = FailureKind(classify(code, err))
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
        component_class(kind, evidence, err.type if err else "", err.message if err else "")
    )
    others = sorted(r for r in failed if r != root)
    kill = s.kills.get(root) if kind == "crash" else None
    if kill is not None:  # a death by a signal, classified by its evidence (diagnose/kill_cause.py)
        fault_class, component = kill.fault_class, kill.component
        evidence = kill.what
        failure = dataclasses.replace(failure, evidence=evidence)
        cause = kill.cause
    elif kind == "exception":
        cause = f"rank {root} raised {err.signature if err else evidence}"
    elif kind == "peer_lost":
        cause = f"rank {root} lost a peer ({evidence}); the cause is on another rank or the network"
    else:
        cause = f"rank {root} {evidence}"
    evidence_lines = (
        (f"rank {root}: {evidence}",)
        + (kill.evidence[1:] if kill is not None else ())
        + tuple(f"rank {r}: {describe_exit(failed[r])}" for r in others)
        + ((f"step {step}",) if step >= 0 else ())
    )
    radius = BlastRadius(nodes=(s.node,), ranks=(root,))
    action = kill.action if kill is not None else "restart the workers (within the restart budget)"
    left = (
        lost_host(s.node, s.world.active, evidence) if kind == "peer_lost" and s.world is not None else None
    )
    if left is not None:  # the survivor is a witness, not the blast radius
        cause = f"host {left.node} left the job: rank {root} on {s.node} lost its peer ({evidence})"
        evidence_lines += (f"lost host {left.node}: {left.how}", f"witness {s.node}: rank {root}")
        radius = BlastRadius(nodes=(left.node,))
        action = f"re-form the group without host {left.node} (within the restart budget)"
    incident = Incident(
        cause=cause,
        fault_class=fault_class,
        component=component,
        confidence=kill.confidence if kill is not None else CRASH_CONFIDENCE[kind],
        action=action,
        ts=detected,
        onset=onset,
        rule=f"kill:{kill.rule}" if kill is not None else "monitor:worker-exits",
        evidence=evidence_lines,
        blast_radius=radius,
    )
    return Decision(
        DecisionKind.CRASH,
        cause if kill is not None else f"rank {root} {evidence}",
        AttemptOutcome(AttemptStatus.FAILED, failure, detected),
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
                DecisionKind.STOPPED_EXIT,
                f"every worker stopped; the emergency checkpoint of step {step} committed",
                AttemptOutcome(AttemptStatus.PREEMPTED, step=step),
            )
        # a failed exit without a stop request was a crash (the exits monitor comes first), so here the
        # workers stopped on a preemption (theirs or ours) without a committed emergency checkpoint
        exits = {c for c in codes.values() if c is not None}  # every worker exited: none is None
        why = why or "workers exited " + ", ".join(describe_exit(c) for c in exits)
        return Decision(
            DecisionKind.STOPPED_EXIT,
            f"every worker stopped; the emergency checkpoint did not commit: {why}",
            AttemptOutcome(AttemptStatus.PREEMPTED_UNSAVED, detail=why, step=step),
        )
    why = durability_problem_in(s.durability, "final")
    if why:  # the training finished but its final state is not safe: say so, never "succeeded"
        return Decision(
            DecisionKind.FINISHED,
            f"every worker finished, but the final state was not committed: {why}",
            AttemptOutcome(AttemptStatus.FINAL_UNSAVED, detail=why, step=s.max_done_step + 1),
        )
    return Decision(DecisionKind.FINISHED, "every worker finished", AttemptOutcome(AttemptStatus.SUCCEEDED))


# --- signals to the agent ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalMonitor:
    emergency_deadline_s: float
    no_sdk_after_s: float = 30.0  # a worker silent this long after start does not use the SDK

    def __call__(self, s: Snapshot) -> Decision | None:
        if s.signal is not None and s.stop_requested_at is None:
            name = _signal.Signals(s.signal).name
            if s.signal == _signal.SIGINT:
                return Decision(
                    DecisionKind.INTERRUPT,
                    f"{name}: stopping the workers",
                    AttemptOutcome(AttemptStatus.INTERRUPTED),
                )
            # every rank stops once the same number of steps is done: one past the step the most
            # advanced heartbeat shows (its step may end before the request lands), or after the first
            # step when no rank has begun one. Heartbeats count even before any step is reported done:
            # a rank may be steps ahead of the agent's reading of its pipe (workers only record
            # signals; the agent coordinates)
            stop = s.max_step_in_progress + 2
            return Decision(
                DecisionKind.REQUEST_STOP,
                f"{name}: every rank saves an emergency checkpoint and stops after step {stop}",
                stop_step=stop,
            )
        if s.stop_requested_at is None:
            return None
        if not s.sdk_ranks and s.now - s.started >= self.no_sdk_after_s:
            # a script without the SDK: nothing to coordinate, pass the stop on as torchrun does
            return Decision(
                DecisionKind.PASS_STOP,
                "no SDK in the script: the stop is passed on",
                AttemptOutcome(AttemptStatus.STOPPED),
            )
        if s.now - s.stop_requested_at > self.emergency_deadline_s:
            saved = [d for d in s.durability.values() if d.kind == "emergency" and d.durable]
            if saved and len(saved) == len(s.ranks):  # every rank had committed; only the exit lagged
                step = max(d.step for d in saved)
                return Decision(
                    DecisionKind.DEADLINE,
                    f"emergency deadline passed after every rank committed step {step}",
                    AttemptOutcome(AttemptStatus.PREEMPTED, step=step),
                )
            detail = f"not every rank finished it within --emergency-deadline {self.emergency_deadline_s:g}s"
            return Decision(
                DecisionKind.DEADLINE, detail, AttemptOutcome(AttemptStatus.PREEMPTED_UNSAVED, detail=detail)
            )
        return Decision(DecisionKind.HOLD, "waiting for the coordinated emergency checkpoint")


# --- membership --------------------------------------------------------------------------------------


def membership(s: Snapshot) -> Decision | None:
    """A node waits to join: re-form the group, unless a rank has done the last step the script
    announced (the job is finishing; a restart would only re-commit the final step)."""
    if not s.nodes_waiting:
        return None
    if s.total_steps and s.max_done_step + 1 >= s.total_steps:
        return None
    return Decision(
        DecisionKind.MEMBERSHIP,
        f"{s.nodes_waiting} node(s) waiting to join",
        AttemptOutcome(AttemptStatus.MEMBERSHIP),
    )


def store_lost(s: Snapshot) -> Decision | None:
    """The rendezvous store has been silent over the store timeout: the job around this node is gone
    or cut off; stop the workers within their grace and let the job policy end the job."""
    if not s.store_unreachable or s.stop_requested_at is not None:
        return None
    return Decision(
        DecisionKind.MEMBERSHIP,
        f"rendezvous store lost: {s.store_unreachable}",
        AttemptOutcome(AttemptStatus.STORE_LOST, detected_at=s.now, detail=s.store_unreachable),
    )


# --- the monitors of a run, in order ------------------------------------------------------------------


class _HangPart(Protocol):
    @property
    def startup_s(self) -> float: ...

    @property
    def cpu_stall_s(self) -> float: ...  # 0: the process-group timeout

    @property
    def pg_timeout_s(self) -> float: ...


class _CheckpointPart(Protocol):
    @property
    def emergency_deadline_s(self) -> float: ...


class MonitorSettings(Protocol):
    """What the monitors read from a run's settings (a ``straggler_policy`` is optional)."""

    @property
    def min_nodes(self) -> int: ...

    @property
    def max_nodes(self) -> int: ...

    @property
    def size_rule(self) -> SizeRule: ...

    @property
    def checkpoint(self) -> _CheckpointPart: ...

    @property
    def hang_policy(self) -> HangTimeoutPolicy: ...

    @property
    def hang(self) -> _HangPart: ...


class SupervisorSettings(MonitorSettings, RecoverySettings, Protocol):
    """What the supervisor reads from a run's settings, its monitors' and in-place recovery's parts
    included: the run configuration, or the simulator's ProbeConfig (sim/agent_probe.py). A
    ``no_python`` flag is optional (the simulator's ranks are never bare scripts)."""

    @property
    def monitor_interval_s(self) -> float: ...

    @property
    def workers(self) -> WorkerSettings: ...

    @property
    def diagnosis(self) -> DiagnosisSettings: ...


def default_monitors(cfg: MonitorSettings, straggler_gate: GateDecision | None = None) -> tuple[Monitor, ...]:
    """The monitors of a run configuration, in :data:`PRIORITY` order; ``straggler_gate``: whether
    this attempt may act on the straggler policy's verdicts (None: observe only)."""
    policy: StragglerActionConfig | None = getattr(cfg, "straggler_policy", None)
    stragglers = StragglerMonitor(
        action=policy if policy is not None else StragglerActionConfig.model_validate({}),
        min_nodes=cfg.min_nodes,
        max_nodes=cfg.max_nodes,
        rule=cfg.size_rule,
        gate=straggler_gate,
    )
    link_bps = getattr(cfg.hang, "slow_link_kbit", 0.0) * 1000 / 8
    return (
        stragglers,
        worker_exits,
        ForwardedStop(cfg.checkpoint.emergency_deadline_s),  # zero: a signal without a Session, as torchrun
        durability,
        FinishedNotExited(getattr(cfg.hang, "pg_timeout_s", DEFAULT_PG_TIMEOUT_S)),
        SignalMonitor(cfg.checkpoint.emergency_deadline_s),
        HangMonitor(
            cfg.hang_policy,
            cfg.hang.startup_s,
            cfg.hang.cpu_stall_s or cfg.hang.pg_timeout_s,
            link_bps,
            getattr(cfg.hang, "pg_timeout_s", 0.0),
            stragglers,
        ),
        store_lost,
        membership,
    )


# stragglers are observed first (they end a tick only to exclude this node, never with a failed worker
# or a stop under way), then exits before anything a signal or a
# silence could suggest (a worker that exited says more than one that is quiet), then the stop a
# signal asks for (while it runs, hangs and membership wait), then hangs (a silent peer is seen there
# first: its hang timeout is shorter than the store timeout), then a lost store, then a joining node
PRIORITY = (
    "stragglers",
    "worker_exits",
    "forwarded_stop",
    "durability",
    "finished_not_exited",
    "signals",
    "hangs",
    "store_lost",
    "membership",
)


def decide(snapshot: Snapshot, monitors: Sequence[Monitor]) -> list[Decision]:
    """The decisions to apply this tick, in order (pure).

    Monitors are asked in the given order; observations (stragglers) are collected and the next
    monitor asked; a stop request is applied to the snapshot and the same monitor asked again (so the
    stop's own rules see it at once); a decision that ends the tick is the last one."""
    out: list[Decision] = []
    i = 0
    while i < len(monitors):
        d = monitors[i](snapshot)
        if d is None:
            i += 1
            continue
        out.append(d)
        if d.ends_tick:
            break
        if d.kind is DecisionKind.REQUEST_STOP:
            snapshot = dataclasses.replace(snapshot, stop_requested_at=snapshot.now)
            continue
        i += 1
    return out
