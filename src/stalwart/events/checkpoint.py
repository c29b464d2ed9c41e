"""Event kinds owned by the checkpoint engine (beyond the core ones in :mod:`stalwart.events`).

Imported by the package at its end, so these kinds decode like the core ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import Event, event


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointPersistFailed(Event):
    """A background persist to one tier failed; older committed checkpoints are untouched."""

    step: int
    tier: str
    reason: str


@event
@dataclass(frozen=True, kw_only=True)
class EmergencyCheckpoint(Event):
    """An emergency persist on a signal or preemption notice, and whether it met its deadline."""

    step: int
    deadline_s: float
    duration_s: float
    committed: bool
    tier: str = ""
    reason: str = ""


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointIntervalAdvised(Event):
    """The interval advisor's recommendation for one tier (Young/Daly)."""

    tier: str
    interval_steps: int
    interval_s: float
    reason: str
    applied: bool = False


@event
@dataclass(frozen=True, kw_only=True)
class PeerReplicated(Event):
    """A node's files of one memory-tier version sent to the peer node that keeps a copy."""

    step: int
    peer: str
    files: int
    bytes: int
    duration_s: float
    ok: bool
    reason: str = ""
