"""The actuator: apply a verdict to a node through a backend and record everything in the ledger."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typing_extensions import assert_never

from ..events import Event
from ..events.node_health import HealthAlert, HealthChecked, NodeDrained, NodeResumed, NodeStateChanged
from .backends import NodeBackend, make_backend
from .findings import CheckStatus
from .lifecycle import (
    UNCHECKED,
    CheckOutcome,
    LifecyclePolicy,
    NodeAction,
    NodeRecord,
    Transition,
    transition,
)
from .node_store import HealthStore
from .rules import Verdict


@dataclass(frozen=True)
class Applied:
    transition: Transition
    read_back: str = ""


def state_changed(
    node: str, before: NodeRecord, tr: Transition, now: float, *, first: bool = False
) -> NodeStateChanged:
    """The ledger record of one lifecycle transition of ``node`` (from ``before`` to ``tr.record``;
    ``first``: the node had no record, so it comes from :data:`UNCHECKED`)."""
    new = tr.record
    return NodeStateChanged(
        ts=now,
        node=node,
        from_state=UNCHECKED if first else before.state.value,
        to_state=new.state.value,
        action=tr.action.value,
        reason=tr.reason,
        state_reason=new.reason,
        fault_key=new.fault_key,
        recoverable=new.recoverable,
        needs_human=new.needs_human,
        strikes=new.strikes,
        readmitted_at=new.readmitted_at,
        readmitted_fault=new.readmitted_fault,
    )


def outcome_of(verdict: Verdict, revalidation: bool) -> CheckOutcome:
    return CheckOutcome(
        status=verdict.status,
        reason=verdict.reason,
        recoverable=verdict.recoverable,
        fault_key=verdict.fault_key(),
        revalidation=revalidation and verdict.status is CheckStatus.PASS,
    )


def apply_verdict(
    node: str,
    verdict: Verdict,
    *,
    level: str,
    backend: NodeBackend,
    store: HealthStore,
    policy: LifecyclePolicy,
    now: float,
    duration_s: float = 0.0,
) -> Applied:
    events = store.events()
    known = store.records(events).get(node)
    rec = known or NodeRecord(node=node, since=now)
    sched = backend.view(node)
    drains = store.recent_auto_drains(now, policy.drain_window_s, events)
    tr = transition(rec, outcome_of(verdict, level == "active"), sched, policy, now, drains)
    out: list[Event] = [
        HealthChecked(
            ts=now,
            node=node,
            level=level,
            status=verdict.status.value,
            action=verdict.action,
            reason=verdict.reason,
            recoverable=verdict.recoverable,
            duration_s=duration_s,
            findings=tuple(
                d.finding.to_json() | {"rule": d.rule, "verdict": d.status.value}
                for d in verdict.decisions
                if d.status is not CheckStatus.PASS
            ),
        )
    ]
    read_back = ""
    match tr.action:
        case NodeAction.DRAIN:
            read_back = backend.drain(node, tr.drain_reason)
            out.append(
                NodeDrained(
                    ts=now, node=node, backend=backend.name, reason=tr.drain_reason, read_back=read_back
                )
            )
        case NodeAction.RESUME:
            read_back = backend.resume(node)
            out.append(
                NodeResumed(ts=now, node=node, backend=backend.name, reason=tr.reason, read_back=read_back)
            )
        case NodeAction.ALERT:
            out.append(HealthAlert(ts=now, node=node, reason=tr.reason, nodes=(node,)))
        case NodeAction.NONE:
            pass
        case _:
            assert_never(tr.action)
    new = tr.record
    if new != rec or tr.changed or known is None:  # a node's first check is recorded, a pass too
        out.append(state_changed(node, rec, tr, now, first=known is None))
    if verdict.status is CheckStatus.PASS and not tr.changed and new == rec and known is not None:
        # a routine pass of a node already on record changes nothing: not recorded, so the ledger
        # grows with incidents, not with the check interval (HealthCheckProgram may run every few
        # seconds on every node)
        return Applied(tr, read_back)
    store.append(node, out)
    return Applied(tr, read_back)


def record_outcome(node: str, outcome: CheckOutcome, *, now: float, state_dir: Path, backend: str) -> str:
    """Apply an outcome that no health check produced (a straggler's quarantine, a link flagged for
    repair) to ``node``'s record through the lifecycle and the backend, as a check's verdict would be
    (blast-radius cap included); returns the state it ended in. No ``HealthChecked`` is written."""

    store = HealthStore(state_dir)
    events = store.events()
    rec = store.records(events).get(node) or NodeRecord(node=node, since=now)
    be = make_backend(backend)
    policy = LifecyclePolicy()
    drains = store.recent_auto_drains(now, policy.drain_window_s, events)
    tr = transition(rec, outcome, be.view(node), policy, now, drains)
    out: list[Event] = []
    match tr.action:
        case NodeAction.DRAIN:
            read_back = be.drain(node, tr.drain_reason)
            out.append(
                NodeDrained(ts=now, node=node, backend=be.name, reason=tr.drain_reason, read_back=read_back)
            )
        case NodeAction.ALERT:
            out.append(HealthAlert(ts=now, node=node, reason=tr.reason, nodes=(node,)))
        case NodeAction.RESUME | NodeAction.NONE:  # only a check's re-validation resumes a node
            pass
        case _:
            assert_never(tr.action)
    out.append(state_changed(node, rec, tr, now))
    store.append(node, out)
    return f"{tr.record.state.value} ({tr.action.value}: {be.name})"
