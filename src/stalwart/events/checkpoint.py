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


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointDamaged(Event):
    """Background verification found a committed version that no longer matches its manifest, and
    set it aside so that no recovery reads it (launch/checkpoint_scrub.py)."""

    step: int
    tier: str
    path: str  # where the version was
    reason: str  # the first file that does not match, and how
    set_aside: str = ""  # where it is now ("" if it could not be moved: the reason says why)
    fallback: str = ""  # what a recovery reads instead


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointsVerified(Event):
    """What background verification did on one node over the job (written when it stops): its cost
    and what it found."""

    readings: int  # versions read
    bytes: int  # bytes read and hashed
    cpu_s: float  # CPU time spent reading (a thread at a lowered priority)
    damaged: int
    duty: float  # the share of one CPU it was allowed
