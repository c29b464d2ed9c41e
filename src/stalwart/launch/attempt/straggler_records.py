"""The ledger records of a straggler decision: the ranks newly slow and no longer slow, and the
straggler-action policy's verdicts with their reasons (launch/attempt/supervisor.py applies the decision)."""

from __future__ import annotations

from ...events import DecisionTaken, StragglerCleared, StragglerDetected
from ..decision import Decision
from ..ports import LedgerSink


def record_stragglers(
    ledger: LedgerSink,
    now: float,
    current: dict[int, float],
    d: Decision,
    step: int,
    slow_links: set[int] | None = None,
) -> None:
    """Write ``d``'s straggler records and update ``current`` (rank -> score of the ranks now slow)
    and ``slow_links`` (the ranks whose silence was raised as a slow link: raised once, until cleared)."""
    ctx = ledger.ctx()
    if d.incident is not None and not d.ends_attempt:  # a slow link's incident (an exclusion's: the caller)
        ledger.emit(d.incident.to_event(ctx["run_id"], ctx["node"], ctx["attempt"]))
        if slow_links is not None and d.rank >= 0:
            slow_links.add(d.rank)
    if slow_links is not None:
        slow_links.difference_update(r for r, _ in d.cleared)
        slow_links.difference_update(d.healed)
    for rank, score in d.detected:
        ledger.emit(StragglerDetected(ts=now, rank=rank, score=score, step=step, evidence=d.evidence, **ctx))
        current[rank] = score
    for rank, score in d.cleared:
        ledger.emit(StragglerCleared(ts=now, rank=rank, score=score, step=step, **ctx))
        current.pop(rank, None)
    # the straggler-action policy's verdicts with their reasons (costs, and the gate's word): a
    # decision record, not an incident; the straggler's cause (a cooling loop, a sick GPU) is the
    # live diagnosis's incident. Observe-only verdicts are recorded as observe_<action>
    for advice in d.advice:
        ledger.emit(
            DecisionTaken(ts=advice.incident.ts, action=advice.action, reason=advice.reason, **ctx),
            show=advice.acted,
        )
