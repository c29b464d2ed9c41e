"""Event kinds of the health package (beyond the core ones in :mod:`stalwart.events`).

The audit trail of checks, state changes, drains and alerts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import Event, event


@event
@dataclass(frozen=True, kw_only=True)
class HealthChecked(Event):
    level: str  # passive | active
    status: str  # pass | warn | fail
    action: str
    reason: str
    recoverable: bool = True
    duration_s: float = 0.0
    findings: tuple[dict[str, Any], ...] = ()  # Any: findings' evidence is JSON of any shape (json.dumps)


@event
@dataclass(frozen=True, kw_only=True)
class NodeStateChanged(Event):
    from_state: str
    to_state: str
    action: str  # none | drain | resume | alert
    reason: str  # why this transition happened
    state_reason: str = ""  # why the node is in its (new) state
    fault_key: str = ""
    recoverable: bool = True
    needs_human: bool = False
    strikes: int = 0
    readmitted_at: float = -1.0
    readmitted_fault: str = ""


@event
@dataclass(frozen=True, kw_only=True)
class NodeDrained(Event):
    backend: str
    reason: str  # the reason as written to the scheduler (carries Stalwart's prefix)
    read_back: str = ""  # the state the scheduler reported afterwards


@event
@dataclass(frozen=True, kw_only=True)
class NodeResumed(Event):
    backend: str
    reason: str
    read_back: str = ""


@event
@dataclass(frozen=True, kw_only=True)
class HealthAlert(Event):
    reason: str
    nodes: tuple[str, ...] = field(default_factory=tuple)
