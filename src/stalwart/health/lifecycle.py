"""Node lifecycle: healthy -> suspect -> quarantined -> probation -> healthy, as a pure function.

``transition(record, outcome, scheduler, policy, now, recent_auto_drains)`` returns the new record,
the action a backend must take (none | drain | resume | alert) and the reason. Ownership: only a node
whose scheduler drain reason starts with Stalwart's prefix is ever resumed by Stalwart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from typing_extensions import assert_never

from ..policy.label import Label
from ..policy.vocabulary import NEVER_CHECKED, NodeState
from .findings import CheckStatus

# a node no check has recorded yet: readers show it as "never checked" (policy/vocabulary.py)
UNCHECKED = NEVER_CHECKED


class NodeAction(Label):
    """What a backend must do after a transition (written to the ledger as it is)."""

    NONE = "none"
    DRAIN = "drain"
    RESUME = "resume"
    ALERT = "alert"


@dataclass(frozen=True)
class NodeRecord:
    node: str
    state: NodeState = NodeState.HEALTHY
    since: float = 0.0
    reason: str = ""
    strikes: int = 0  # warnings in a row (suspect) or passes in a row (probation)
    fault_key: str = ""  # the rules that put the node in quarantine
    recoverable: bool = True
    needs_human: bool = False
    readmitted_at: float = -1.0
    readmitted_fault: str = ""


@dataclass(frozen=True)
class CheckOutcome:
    status: CheckStatus
    reason: str
    recoverable: bool = True
    fault_key: str = ""
    revalidation: bool = False  # the active suite ran and passed too

    def __post_init__(self) -> None:
        # callers that still pass "pass" | "warn" | "fail" get the enum (an unknown text raises)
        object.__setattr__(self, "status", CheckStatus(self.status))


@dataclass(frozen=True)
class SchedulerView:
    """What the scheduler says about the node right now (``None`` from the local backend)."""

    drained: bool
    reason: str = ""
    state: str = ""


@dataclass(frozen=True)
class LifecyclePolicy:
    prefix: str = "stalwart:"
    suspect_strikes: int = 2
    probation_passes: int = 1
    readmit_requires_active: bool = True
    escalation_window_s: float = 7 * 86400.0  # same fault again within a week of re-admission
    max_auto_drains: int = 2  # blast-radius cap ...
    drain_window_s: float = 3600.0  # ... per window

    def owns(self, reason: str) -> bool:
        return reason.strip().startswith(self.prefix)


@dataclass(frozen=True)
class Transition:
    record: NodeRecord
    action: NodeAction
    reason: str
    drain_reason: str = ""

    @property
    def changed(self) -> bool:
        return self.action is not NodeAction.NONE


def _drain_text(policy: LifecyclePolicy, reason: str) -> str:
    # Slurm keeps the reason verbatim; keep it to one readable line
    return f"{policy.prefix} {reason}".replace("\n", " ")[:240]


def _quarantine(
    rec: NodeRecord,
    outcome: CheckOutcome,
    sched: SchedulerView | None,
    policy: LifecyclePolicy,
    now: float,
    recent_auto_drains: int,
    why: str,
) -> Transition:
    recurred = (
        rec.readmitted_at >= 0
        and now - rec.readmitted_at <= policy.escalation_window_s
        and outcome.fault_key
        and set(outcome.fault_key.split(",")) & set(rec.readmitted_fault.split(","))
    )
    recoverable = outcome.recoverable and not recurred
    if recurred:
        why += f" (recurred {now - rec.readmitted_at:.0f} s after re-admission: escalated to irrecoverable)"
    drained = sched is not None and sched.drained  # already out of the pool: no drain, no cap
    if recent_auto_drains >= policy.max_auto_drains and not drained:
        new = replace(rec, state=NodeState.SUSPECT, since=now, reason=why, fault_key=outcome.fault_key)
        return Transition(
            new,
            NodeAction.ALERT,
            f"blast-radius cap: {recent_auto_drains} automatic drains in the last "
            f"{policy.drain_window_s:.0f} s (cap {policy.max_auto_drains}); not draining "
            f"{rec.node}, paging a human instead: {why}",
        )
    new = replace(
        rec,
        state=NodeState.QUARANTINED,
        since=now,
        reason=why,
        strikes=0,
        fault_key=outcome.fault_key,
        recoverable=recoverable,
        needs_human=not recoverable,
    )
    if drained:
        return Transition(new, NodeAction.NONE, f"quarantined (already drained): {why}")
    return Transition(new, NodeAction.DRAIN, f"drain: {why}", drain_reason=_drain_text(policy, why))


def _on_probation(rec: NodeRecord, now: float, reason: str) -> NodeRecord:
    """The record of a quarantined node re-admitted on probation (its fault kept for escalation)."""
    return replace(
        rec,
        state=NodeState.PROBATION,
        since=now,
        strikes=0,
        reason=reason,
        readmitted_at=now,
        readmitted_fault=rec.fault_key,
    )


def transition(
    rec: NodeRecord,
    outcome: CheckOutcome,
    sched: SchedulerView | None,
    policy: LifecyclePolicy,
    now: float,
    recent_auto_drains: int = 0,
) -> Transition:
    """Decide the node's next state and the action to take. Pure: no I/O, no clock."""
    if sched is not None and sched.drained and not policy.owns(sched.reason):
        return Transition(
            rec,
            NodeAction.NONE,
            f"drained by someone else (reason {sched.reason!r}): not Stalwart's, left alone",
        )
    match outcome.status:
        case CheckStatus.FAIL:
            return _on_fail(rec, outcome, sched, policy, now, recent_auto_drains)
        case CheckStatus.WARN:
            return _on_warn(rec, outcome, sched, policy, now, recent_auto_drains)
        case CheckStatus.PASS:
            return _on_pass(rec, outcome, sched, policy, now)
        case _:
            assert_never(outcome.status)


def _on_fail(
    rec: NodeRecord,
    outcome: CheckOutcome,
    sched: SchedulerView | None,
    policy: LifecyclePolicy,
    now: float,
    recent_auto_drains: int,
) -> Transition:
    if rec.state is not NodeState.QUARANTINED:
        return _quarantine(rec, outcome, sched, policy, now, recent_auto_drains, outcome.reason)
    if sched is not None and not sched.drained:
        why = f"still failing after an outside resume: {outcome.reason}"
        return _quarantine(rec, outcome, sched, policy, now, recent_auto_drains, why)
    return Transition(
        replace(rec, reason=outcome.reason, strikes=0),
        NodeAction.NONE,
        f"still quarantined: {outcome.reason}",
    )


def _on_warn(
    rec: NodeRecord,
    outcome: CheckOutcome,
    sched: SchedulerView | None,
    policy: LifecyclePolicy,
    now: float,
    recent_auto_drains: int,
) -> Transition:
    st = rec.state
    match st:
        case NodeState.HEALTHY | NodeState.SUSPECT:
            strikes = rec.strikes + 1 if st is NodeState.SUSPECT else 1
            if strikes >= policy.suspect_strikes:
                why = f"warned {strikes} checks in a row: {outcome.reason}"
                return _quarantine(rec, outcome, sched, policy, now, recent_auto_drains, why)
            new = replace(
                rec,
                state=NodeState.SUSPECT,
                since=now if st is not NodeState.SUSPECT else rec.since,
                reason=outcome.reason,
                strikes=strikes,
            )
            return Transition(
                new, NodeAction.NONE, f"suspect ({strikes}/{policy.suspect_strikes}): {outcome.reason}"
            )
        case NodeState.PROBATION:
            return Transition(
                replace(rec, strikes=0, reason=outcome.reason),
                NodeAction.NONE,
                f"probation restarted by a warning: {outcome.reason}",
            )
        case NodeState.QUARANTINED:
            return Transition(
                rec, NodeAction.NONE, f"still quarantined (a warning is not a pass): {outcome.reason}"
            )
        case _:
            assert_never(st)


def _on_pass(
    rec: NodeRecord, outcome: CheckOutcome, sched: SchedulerView | None, policy: LifecyclePolicy, now: float
) -> Transition:
    st = rec.state
    match st:
        case NodeState.HEALTHY:
            return Transition(replace(rec, strikes=0), NodeAction.NONE, "healthy")
        case NodeState.SUSPECT:
            return Transition(
                replace(rec, state=NodeState.HEALTHY, since=now, reason="passed again", strikes=0),
                NodeAction.NONE,
                "suspect -> healthy: passed again",
            )
        case NodeState.QUARANTINED:
            return _readmit(rec, outcome, sched, policy, now)
        case NodeState.PROBATION:
            passes = rec.strikes + 1
            if passes >= policy.probation_passes:
                return Transition(
                    replace(rec, state=NodeState.HEALTHY, since=now, strikes=0, reason="probation passed"),
                    NodeAction.NONE,
                    f"probation -> healthy after {passes} passing checks",
                )
            return Transition(
                replace(rec, strikes=passes), NodeAction.NONE, f"probation {passes}/{policy.probation_passes}"
            )
        case _:
            assert_never(st)


def _readmit(
    rec: NodeRecord, outcome: CheckOutcome, sched: SchedulerView | None, policy: LifecyclePolicy, now: float
) -> Transition:
    """A quarantined node passed: on probation if resumed outside Stalwart or re-validated."""
    if sched is not None and not sched.drained:
        new = _on_probation(rec, now, "resumed outside Stalwart")
        return Transition(new, NodeAction.NONE, "quarantined node was resumed outside Stalwart; on probation")
    if rec.needs_human:
        return Transition(
            rec,
            NodeAction.NONE,
            f"irrecoverable fault ({rec.reason}): passing checks do not re-admit it; "
            "an operator must repair and resume the node",
        )
    if policy.readmit_requires_active and not outcome.revalidation:
        return Transition(
            rec,
            NodeAction.NONE,
            "passive checks pass, but re-admission needs the active suite (stalwart health check --active)",
        )
    new = _on_probation(rec, now, "re-validation passed")
    return Transition(
        new, NodeAction.RESUME, f"resume: re-validation passed after '{rec.reason}'; on probation"
    )
