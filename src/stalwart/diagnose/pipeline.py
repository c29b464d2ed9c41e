"""From ledger events to incidents: the entry point the agent calls after a failure.

:func:`incidents_from_events` groups ``FailureDetected`` events into interruptions (everything up
to the next ``DecisionTaken`` is one interruption: several ranks report the same fault), takes the
health findings recorded in ``HealthChecked`` events plus any extra signals (kernel log, process
states) as evidence, and returns one incident per interruption whose symptom is a communication
failure or a hang. Other failures are already their own cause (a user exception, a crash with a
signal) and are left to the agent's verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..events import (
    AttemptStarted,
    DecisionTaken,
    Event,
    FailureDetected,
    ReformedInPlace,
    StackCaptured,
    StragglerDetected,
    WorkersStarted,
)
from .cross_layer import CrossRules, diagnose_comm_failure
from .incident import Incident
from .signals import (
    Signal,
    from_exclusion,
    from_failure,
    from_health_event,
    from_injection,
    from_stack,
    from_straggler,
)


def interruptions(events: Sequence[Event]) -> list[list[FailureDetected]]:
    """``FailureDetected`` events grouped by fault: everything up to the next ``DecisionTaken`` is one
    interruption (several ranks report the same fault). A lost peer that another host reports after
    that decision, before any worker started again (a new attempt, workers started, a re-formation
    done), is the same fault seen from its side: its ranks lost the peer the decided failure took (a
    whole-group restart across nodes, where the other node's ranks end when the failed one's do)."""
    groups: list[list[FailureDetected]] = []
    open_group = False
    echoes = False  # a lost peer on another host still belongs to the last interruption
    for e in sorted(events, key=lambda e: e.ts):
        if isinstance(e, FailureDetected):
            echo = echoes and e.failure == "peer_lost" and all(f.node != e.node for f in groups[-1])
            if open_group or echo:
                groups[-1].append(e)
            else:
                groups.append([e])
                open_group = echoes = True
        elif isinstance(e, DecisionTaken):
            open_group = False
            if e.action.startswith("start_"):
                echoes = False
        elif isinstance(e, AttemptStarted | WorkersStarted | ReformedInPlace):
            echoes = False
    return groups


def evidence_signals(events: Iterable[Event]) -> tuple[Signal, ...]:
    out: list[Signal] = []
    for e in events:
        if e.kind == "HealthChecked":
            out.extend(from_health_event(e))
        elif isinstance(e, StragglerDetected):
            out.append(from_straggler(e))
        elif isinstance(e, DecisionTaken) and (sig := from_exclusion(e)) is not None:
            out.append(sig)
        elif isinstance(e, StackCaptured) and (sig := from_stack(e)) is not None:
            out.append(sig)
        elif isinstance(e, FailureDetected) and (sig := from_injection(e)) is not None:
            out.append(sig)
    return tuple(out)


def incidents_from_events(
    events: Sequence[Event], now: float, *, extra: Sequence[Signal] = (), rules: CrossRules | None = None
) -> tuple[Incident, ...]:
    """One incident per interruption whose symptom is a communication failure or a hang (pure)."""
    evs = sorted(events, key=lambda e: e.ts)
    evidence = evidence_signals(evs) + tuple(extra)
    attempts = [e for e in evs if isinstance(e, AttemptStarted)]
    out = []
    for group in interruptions(evs):
        onset = min(f.onset or f.ts for f in group)
        world = max((a.world_size for a in attempts if a.ts <= onset), default=0)
        inc = diagnose_comm_failure([from_failure(f) for f in group], evidence, now, rules, gpus=world)
        if inc is not None:
            out.append(inc)
    return tuple(out)
