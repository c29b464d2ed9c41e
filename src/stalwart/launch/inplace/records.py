"""What the ledger says about an in-place recovery once it completed (docs/fast-recovery.md).

Pure builders of :class:`~stalwart.events.ReformedInPlace` from the machine's state and the local
ranks' :class:`~stalwart.protocol.Reformed` reports, and of the records of a node lost without a hot
spare; the executor (launch/inplace/recovery.py) emits them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...diagnose.incident import dead_agent_incident, silent_host_incident
from ...events import FailureDetected, IncidentRaised, ReformedInPlace
from ...protocol import Reformed
from .machine import InPlaceState, Pending, Resize


# Any: unpacked as the keyword arguments of each event (run_id: str, node: str, attempt: int)
def replaced(p: Pending, msgs: Sequence[Reformed], now: float, ctx: Mapping[str, Any]) -> ReformedInPlace:
    """This node replaced its failed ranks and every local rank joined: the phases of the recovery,
    detect (fault -> detection), replace (-> replacements started), then the slowest rank's own."""
    step = max(m.step for m in msgs)
    outcome = p.decision.outcome
    phases = {
        "detect": max(0.0, outcome.detected_at - p.decision.onset) if outcome and p.decision.onset else 0.0
    }
    phases["replace"] = p.replace_s
    for name in ("abort", "wait", "rendezvous", "transfer"):
        vals = [m.phases.get(name, 0.0) for m in msgs if name in m.phases]
        phases[name] = max(vals) if vals else 0.0
    return ReformedInPlace(
        ts=now,
        generation=p.plan.generation,
        ranks=tuple(sorted(p.plan.ranks)),
        step=step,
        lost_steps=max(0, p.done_before - step),
        bytes_moved=sum(m.received for m in msgs),
        state_bytes=max((m.received for m in msgs), default=0),
        phases=phases,
        **ctx,
    )


def joined(
    s: InPlaceState,
    local: Sequence[int],
    msgs: Sequence[Reformed],
    now: float,
    ctx: Mapping[str, Any],  # Any: unpacked as each event's keyword arguments
) -> ReformedInPlace:
    """The local ranks joined a generation this node did not replace ranks for: a hot spare's take-over,
    a newcomer's start, or the shrink or grow this node announced. Survivors keep their last completed
    step (a data-parallel step completes on every rank or on none), so nothing beyond the interrupted
    step is redone."""
    assert s.since is not None
    r = s.resized
    step = max(m.step for m in msgs)
    interrupted = r.interrupted if r is not None else step
    phases = {"join" if r is not None else "replace": max(0.0, min(m.t for m in msgs) - s.since)}
    for name in ("rendezvous", "transfer"):
        phases[name] = max((m.phases.get(name, 0.0) for m in msgs), default=0.0)
    ranks: tuple[int, ...] = tuple(sorted(local))
    if r is not None:
        match r.kind:
            case Resize.SHRINK:
                ranks = ()  # a shrink replaced no rank
            case Resize.GROW:
                ranks = tuple(range(r.old, s.world_size))  # the newcomers' ranks
    return ReformedInPlace(
        ts=now,
        generation=s.generation,
        ranks=ranks,
        step=step,
        lost_steps=max(0, interrupted - step),
        bytes_moved=sum(m.received for m in msgs),
        state_bytes=max(m.received for m in msgs),
        phases=phases,
        world_size=s.world_size if r is not None else 0,
        shrunk_from=r.old if r is not None and r.kind is Resize.SHRINK else 0,
        grown_from=r.old if r is not None and r.kind is Resize.GROW else 0,
        **ctx,
    )


def lost_without_spare(
    lost: Sequence[str],
    node: str,
    active: Sequence[str],
    silent: Mapping[str, float],
    nproc_per_node: int,
    now: float,
    ctx: Mapping[str, Any],  # Any: unpacked as each event's keyword arguments
    dead: Mapping[str, float] | None = None,
    left: frozenset[str] = frozenset(),
    waited: bool = True,
) -> tuple[FailureDetected, IncidentRaised]:
    """The lost node's failure, as this node detected it (its agent is gone), and the incident that
    names the lost host (this node is its witness): a dead agent (its liveness connection closed,
    ``dead``: node -> seconds since seen), an agent that left the job on purpose (of ``dead``, in
    ``left``: it excluded its own node) or a silent host (its heartbeat past the bound; ``waited``: this
    node's ranks reported waiting for a new generation, else they are still blocked in a step with it)."""
    gone = ", ".join(lost)
    action = f"re-formed the group in place without host {gone}"
    rank = min(list(active).index(n) for n in lost) * nproc_per_node
    seen = [dead[n] for n in lost if dead and n in dead]
    if left and left.issuperset(lost):
        onset = now - max(seen) if seen else now
        evidence = (
            f"node {gone}: its agent left the job on purpose (it excluded its own node) while its peers wait"
        )
        found = dead_agent_incident(tuple(lost), node, onset, now, action, left=True)
    elif seen and len(seen) == len(lost):
        onset = now - max(seen)
        evidence = (
            f"node {gone}: its agent's process is gone (its liveness connection closed) while its peers wait"
        )
        found = dead_agent_incident(tuple(lost), node, onset, now, action)
    else:
        quiet = max(silent.get(n, 0.0) for n in lost)
        onset = now - quiet
        blocked = (
            "while its peers wait" if waited else "and nothing from its host, while its peers are blocked"
        )
        evidence = f"node {gone}: no heartbeat for {quiet:.1f}s {blocked}"
        found = silent_host_incident(tuple(lost), node, quiet, now, action, waited)
    failure = FailureDetected(ts=now, failure="agent_lost", evidence=evidence, onset=onset, rank=rank, **ctx)
    return failure, found.to_event(**ctx)
