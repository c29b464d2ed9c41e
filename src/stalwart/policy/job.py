"""The job policy: what a node agent does next, as a pure function of the job so far and what just
happened. No I/O, no clock of its own: the runner (launch/runner.py) gathers an observation through
its ports, asks :func:`next`, and carries the decision out.

Observations, in the order a round meets them:

* :class:`Unhealthy`: the health gate refused this node before a start;
* :class:`RendezvousFailed`: the round could not be formed;
* :class:`Met`: the round formed with these nodes (by group rank), and a signal may have come in;
* :class:`Outcome`: an attempt (or a hot spare's wait) ended with an :class:`AttemptStatus`;
* :class:`TookOver`: a hot spare, while it stood by, took a lost node's place in place.

Decisions (frozen, each with a reason, and the job's state after it):

* :class:`Restart`: the whole group again. Without a plan: re-form the round (a failure within the
  restart budget, a node waiting to join); with a plan: start the workers on it (the world is the
  one before, or the first);
* :class:`Replace`: start on a plan of the same size in which a node that was not in the world (a hot
  spare) takes the place of one that left;
* :class:`Shrink`: start on a smaller valid world;
* :class:`StandBy`: this node is a hot spare of the plan: no workers, wait for the job to end or to
  re-form;
* :class:`End`: the job ends here with an outcome, a one-line verdict and an exit code that says
  whether a requeue helps; the verdicts are the table :data:`VERDICTS`.

Failures ask the restart policy (:func:`stalwart.policy.restart_policy.decide`) over the job's history.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from typing_extensions import assert_never

from ..exit_codes import EXIT_BAD_INPUT, EXIT_INFRA, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED
from ..terminal import plural
from .label import Label
from .restart_policy import Failure, RestartAction, RestartBudget, decide
from .world_size import SizeRule, WorldPlan, plan_world


class AttemptStatus(Label):
    """How an attempt (or a hot spare's wait) ended."""

    SUCCEEDED = "succeeded"  # every worker finished (or, for a spare: the job finished)
    FINAL_UNSAVED = "final_unsaved"  # finished, but the final save did not commit
    FAILED = "failed"  # a crash, hang or lost peer: the outcome carries the failure record
    MEMBERSHIP = "membership"  # a node waits to join: re-form the group
    PREEMPTED = "preempted"  # stopped by a signal with the emergency save committed
    PREEMPTED_UNSAVED = "preempted_unsaved"  # stopped by a signal, the emergency save did not commit
    STOPPED = "stopped"  # stopped by a signal, workers without the SDK (no emergency save)
    INTERRUPTED = "interrupted"  # SIGINT: the operator
    EXCLUDED = "excluded"  # this node left the job: a straggler, or it corrupted a replica silently
    STORE_LOST = "store_lost"  # the rendezvous store stayed silent over its timeout (the job went away)


# --- what the policy is told ------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    status: AttemptStatus
    failure: Failure | None = None  # FAILED: the failure record
    step: int = -1  # the step of the emergency or final save
    detail: str = ""  # why a save did not commit; why the node was excluded
    newest_good: int | None = None  # the newest checkpoint step on disk that verifies (the run files')
    signal: int | None = None  # the signal the agent received, if any
    in_place: int = 0  # failures recovered in place during the attempt (policy/inplace.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", AttemptStatus(self.status))


@dataclass(frozen=True)
class Unhealthy:
    reason: str  # why the health gate refused this node
    node_state: str = ""  # the node's state after the gate


@dataclass(frozen=True)
class RendezvousFailed:
    error: str  # "Type: first line of the message"
    refused: bool = False  # the store refused this agent (its certificate, user, key): a requeue cannot help
    # the run directory's ledger says another node ended the job succeeded since this agent started
    # (the store went with it): what it says; this agent arrived at the end and has nothing to do
    finished: str = ""


@dataclass(frozen=True)
class Met:
    names: tuple[str, ...]  # the round's nodes by group rank
    signal: int | None = None  # a signal that came in while the round formed


@dataclass(frozen=True)
class TookOver:
    """This hot spare takes a lost node's place in place (policy/inplace.py ``take_over``): the other
    nodes' ranks keep their processes and join the generation this node's new ranks form."""

    plan: WorldPlan  # the round's plan with this node in the lost node's place
    reason: str


Observation = Outcome | Unhealthy | RendezvousFailed | Met | TookOver


# --- the job ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """What the policy needs of the run configuration."""

    node: str
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    size_rule: SizeRule = SizeRule()
    budget: RestartBudget = RestartBudget()


@dataclass(frozen=True)
class JobState:
    spec: JobSpec
    attempt: int = 0
    history: tuple[Failure, ...] = ()  # every failure of the job so far
    plan: WorldPlan | None = None  # the world of this node's newest round
    standing_by: bool = False  # this node is a hot spare of ``plan``
    in_place: int = 0  # failures recovered in place (the survivors kept their processes) so far


@dataclass(frozen=True)
class Record:
    """A decision the runner writes to the ledger (``DecisionTaken``)."""

    action: str
    reason: str
    ts: float
    restarts_used: int = 0
    restarts_allowed: int = 0
    backoff_s: float = 0.0


@dataclass(frozen=True)
class Restart:
    reason: str
    state: JobState
    plan: WorldPlan | None = None  # None: re-form the round first; else start the workers on it
    backoff_s: float = 0.0
    records: tuple[Record, ...] = ()


@dataclass(frozen=True)
class Replace:
    reason: str
    state: JobState
    plan: WorldPlan
    records: tuple[Record, ...] = ()


@dataclass(frozen=True)
class Shrink:
    reason: str
    state: JobState
    plan: WorldPlan
    records: tuple[Record, ...] = ()


@dataclass(frozen=True)
class StandBy:
    reason: str
    state: JobState
    plan: WorldPlan
    records: tuple[Record, ...] = ()


@dataclass(frozen=True)
class End:
    outcome: str
    verdict: str
    exit_code: int
    state: JobState
    records: tuple[Record, ...] = ()
    left: bool = False  # this node leaves a job that goes on: the round stays open for the others

    @property
    def reason(self) -> str:
        return self.verdict


JobDecision = Restart | Replace | Shrink | StandBy | End


# --- the verdicts, as data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    outcome: str  # the job's outcome name in the ledger
    text: str  # a ``str.format`` template over :func:`_fields`
    exit_code: int
    left: bool = False


_NOT_SAVED = "{newest}; a requeue resumes from there"
VERDICTS: Mapping[str, Verdict] = MappingProxyType(
    {
        "succeeded": Verdict(
            "succeeded",
            "training finished after {attempts}, {failures} recovered",
            EXIT_OK,
        ),
        "final_unsaved": Verdict(
            "final_unsaved",
            "training finished, but its final state (step {step}) was NOT committed ({detail}); "
            + _NOT_SAVED,
            EXIT_INFRA,
        ),
        "stopped": Verdict(
            "preempted",
            "preempted by {signal}: the signal was passed to the workers and they stopped (no SDK, no "
            "emergency checkpoint by Stalwart); the script's own checkpoints decide where a requeue resumes",
            EXIT_PREEMPTED,
        ),
        "preempted": Verdict(
            "preempted", "preempted: emergency checkpoint{at} committed; requeue to resume", EXIT_PREEMPTED
        ),
        "preempted_not_on_disk": Verdict(
            "preempted_unsaved",
            "preempted, but the emergency checkpoint of step {step} does not verify on disk; " + _NOT_SAVED,
            EXIT_INFRA,
        ),
        "preempted_unsaved": Verdict(
            "preempted_unsaved",
            "preempted, but the emergency checkpoint was NOT committed ({detail}); " + _NOT_SAVED,
            EXIT_INFRA,
        ),
        "interrupted": Verdict("aborted", "interrupted by the operator", EXIT_INTERRUPTED),
        "excluded": Verdict(
            "node_excluded",
            "node {node} excluded and quarantined as {detail}; the other nodes continue without it",
            EXIT_INFRA,
            left=True,
        ),
        "spare_succeeded": Verdict(
            "succeeded", "the job finished while this node stood by as a hot spare", EXIT_OK
        ),
        "spare_stopped": Verdict("aborted", "hot spare stopped: {status}", EXIT_INFRA),
        "unhealthy": Verdict(
            "node_unhealthy",
            "node {node} excluded by the health gate: {detail}; the other nodes continue without it",
            EXIT_INFRA,
            left=True,
        ),
        "rendezvous_failed": Verdict("rendezvous_failed", "rendezvous failed: {detail}", EXIT_INFRA),
        "finished_elsewhere": Verdict(
            "succeeded", "{detail}; this agent arrived at its end: nothing to join, nothing launched", EXIT_OK
        ),
        "rendezvous_refused": Verdict(
            "rendezvous_failed", "the rendezvous store refused this agent: {detail}", EXIT_BAD_INPUT
        ),
        "store_lost": Verdict(
            "rendezvous_failed", "rendezvous store lost during the attempt: {detail}", EXIT_INFRA
        ),
        "no_world": Verdict("rendezvous_failed", "{detail}", EXIT_INFRA),
        "signalled_before_start": Verdict("interrupted", "stopped by {signal} before start", EXIT_PREEMPTED),
        "interrupted_before_start": Verdict(
            "interrupted", "stopped by {signal} before start", EXIT_INTERRUPTED
        ),
    }
)
# the run files' newest good checkpoint: the runner reads it for these statuses only
NEEDS_NEWEST = frozenset(
    {AttemptStatus.PREEMPTED, AttemptStatus.PREEMPTED_UNSAVED, AttemptStatus.FINAL_UNSAVED}
)


def _signal_name(signum: int | None) -> str:
    return signal.Signals(signum if signum is not None else signal.SIGTERM).name


def _fields(state: JobState, out: Outcome) -> dict[str, object]:
    newest = (
        f"newest good checkpoint: step {out.newest_good}"
        if out.newest_good is not None
        else "no good checkpoint on disk"
    )
    return {
        "attempts": plural(state.attempt + 1, "attempt"),
        "failures": plural(len(state.history) + state.in_place, "failure"),
        "node": state.spec.node,
        "step": out.step,
        "at": f" of step {out.step}" if out.step >= 0 else "",
        "detail": out.detail,
        "newest": newest,
        "signal": _signal_name(out.signal),
        "status": out.status,
    }


def end(state: JobState, key: str, out: Outcome, records: tuple[Record, ...] = ()) -> End:
    """The verdict ``key`` of :data:`VERDICTS`, filled from the job and the outcome."""
    v = VERDICTS[key]
    return End(v.outcome, v.text.format(**_fields(state, out)), v.exit_code, state, records, v.left)


# --- the policy -------------------------------------------------------------------------------------


def initial(spec: JobSpec) -> JobState:
    return JobState(spec)


def next(state: JobState, observation: Observation, now: float) -> JobDecision:  # noqa: A001 - the policy's verb
    """What the job does after ``observation`` (pure)."""
    match observation:
        case Unhealthy(reason=reason, node_state=node_state):
            why = f"exclude node {state.spec.node}: {reason} (node state {node_state})"
            records = (Record("exclude_node", why, now),)
            return end(state, "unhealthy", Outcome(AttemptStatus.FAILED, detail=reason), records)
        case RendezvousFailed(error=error, refused=refused, finished=finished):
            if finished:
                return end(state, "finished_elsewhere", Outcome(AttemptStatus.FAILED, detail=finished))
            key = "rendezvous_refused" if refused else "rendezvous_failed"
            return end(state, key, Outcome(AttemptStatus.FAILED, detail=error))
        case Met():
            return _world(state, observation, now)
        case TookOver(plan=plan, reason=reason):
            after = replace(state, plan=plan, standing_by=False)
            return Replace(f"take over: {reason}", after, plan, (Record("take_over", reason, now),))
        case Outcome():
            if observation.in_place:
                state = replace(state, in_place=state.in_place + observation.in_place)
            if state.standing_by:
                return _after_standby(state, observation)
            return _after_attempt(state, observation, now)
        case _:
            assert_never(observation)


def _world(state: JobState, met: Met, now: float) -> JobDecision:
    spec = state.spec
    if met.signal is not None:
        key = "interrupted_before_start" if met.signal == signal.SIGINT else "signalled_before_start"
        return end(state, key, Outcome(AttemptStatus.INTERRUPTED, signal=met.signal))
    plan = plan_world(met.names, spec.nproc_per_node, 1, spec.max_nodes, spec.size_rule)
    if not plan.runnable or len(plan.active) < spec.min_nodes:
        return end(state, "no_world", Outcome(AttemptStatus.FAILED, detail=plan.reason))
    before = state.plan
    after = replace(state, plan=plan, standing_by=spec.node in plan.spares)
    if after.standing_by:
        return StandBy(
            f"hot spare: {plan.reason}", after, plan, (Record("standby", f"hot spare: {plan.reason}", now),)
        )
    records: tuple[Record, ...] = ()
    if (
        len(met.names) > 1
        and spec.node == plan.active[0]
        and (plan.spares or len(met.names) != len(plan.active))
    ):
        records = (Record("plan_world", plan.reason, now),)
    if before is None or not before.active:
        return Restart(f"start: {plan.reason}", after, plan, records=records)
    if len(plan.active) < len(before.active):
        return Shrink(
            f"shrink: {len(before.active)} -> {len(plan.active)} node(s): {plan.reason}", after, plan, records
        )
    joined = [n for n in plan.active if n not in before.active]
    gone = [n for n in before.active if n not in plan.active]
    if joined and len(plan.active) == len(before.active):
        return Replace(
            f"replace: {', '.join(joined)} take(s) the place of {', '.join(gone)}; world size stays "
            f"{plan.world_size}",
            after,
            plan,
            records,
        )
    return Restart(f"restart the whole group: {plan.reason}", after, plan, records=records)


def _after_standby(state: JobState, out: Outcome) -> JobDecision:
    if out.status is AttemptStatus.SUCCEEDED:
        return end(state, "spare_succeeded", out)
    if out.status is AttemptStatus.MEMBERSHIP:
        return Restart(
            "a node waits to join: the hot spare re-joins the round",
            replace(state, attempt=state.attempt + 1, standing_by=False),
        )
    return end(state, "spare_stopped", out)


def _after_attempt(state: JobState, out: Outcome, now: float) -> JobDecision:
    match out.status:
        case (
            AttemptStatus.SUCCEEDED
            | AttemptStatus.FINAL_UNSAVED
            | AttemptStatus.STOPPED
            | AttemptStatus.PREEMPTED_UNSAVED
            | AttemptStatus.INTERRUPTED
            | AttemptStatus.EXCLUDED
        ):
            return end(state, out.status.value, out)
        case AttemptStatus.PREEMPTED:
            saved_elsewhere = out.step >= 0 and out.newest_good is not None and out.newest_good != out.step
            return end(state, "preempted_not_on_disk" if saved_elsewhere else "preempted", out)
        case AttemptStatus.MEMBERSHIP:
            why = "restart: a node is waiting to join; re-forming the group"
            return Restart(
                why, replace(state, attempt=state.attempt + 1), records=(Record("restart", why, now),)
            )
        case AttemptStatus.FAILED:
            return _failed(state, out, now)
        case (
            AttemptStatus.STORE_LOST
        ):  # the store stayed silent over its timeout (launch/rendezvous/store_watch.py)
            return end(state, "store_lost", out)
        case _:
            assert_never(out.status)


def _failed(state: JobState, out: Outcome, now: float) -> JobDecision:
    if out.failure is None:
        raise ValueError("a failed attempt's outcome carries its failure record")
    history = (*state.history, out.failure)
    budget = state.spec.budget
    d = decide(history, budget)
    record = Record(
        str(d.action),
        d.reason,
        now,
        restarts_used=d.infra_used,
        restarts_allowed=budget.max_restarts,
        backoff_s=d.backoff_s,
    )
    match d.action:
        case RestartAction.STOP:
            return End(d.outcome, d.reason, d.exit_code, replace(state, history=history), (record,))
        case RestartAction.RESTART:
            after = replace(state, attempt=state.attempt + 1, history=history)
            return Restart(d.reason, after, backoff_s=d.backoff_s, records=(record,))
        case _:
            assert_never(d.action)


__all__ = [
    "NEEDS_NEWEST",
    "VERDICTS",
    "AttemptStatus",
    "End",
    "JobDecision",
    "JobSpec",
    "JobState",
    "Met",
    "Observation",
    "Outcome",
    "Record",
    "RendezvousFailed",
    "Replace",
    "Restart",
    "Shrink",
    "StandBy",
    "TookOver",
    "Unhealthy",
    "Verdict",
    "end",
    "initial",
    "next",
]
