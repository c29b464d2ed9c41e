"""Event kinds of state integrity: silent data corruption found by comparing data-parallel replicas
(``train/replica_check.py``), beyond the core kinds in :mod:`stalwart.events`."""

from __future__ import annotations

from dataclasses import dataclass

from . import Event, event


@event
@dataclass(frozen=True, kw_only=True)
class SilentCorruption(Event):
    """Replicas that must hold identical state did not, found after ``step`` completed steps (the
    rank that writes it is the event's ``rank``; the replicas it suspects are ``suspect_ranks``)."""

    step: int
    verdict: str  # policy.sdc.ReplicaVerdict: odd_one_out | pair | split
    suspect_ranks: tuple[int, ...] = ()
    suspect_nodes: tuple[str, ...] = ()
    confidence: float = 0.0  # that the suspects' nodes caused it
    action: str = ""  # policy.sdc.SdcAction: rollback | halt
    to_step: int = -1  # the checkpoint rolled back to (verified clean when saved)
    interval: int = 0  # steps between checks when it was found
    last_clean_step: int = -1  # the last check before this one that found the replicas identical
    tensors: tuple[str, ...] = ()  # the state tensors whose fingerprints differ (at most a few)
    evidence: tuple[str, ...] = ()  # each differing tensor's fingerprint per replica
    reason: str = ""
