"""Event kinds of state integrity: silent data corruption found by comparing data-parallel replicas
(``train/replica_check.py``), and a rank's loss or gradient norm leaving its running range
(``train/anomaly_watch.py``), beyond the core kinds in :mod:`stalwart.events`."""

from __future__ import annotations

from dataclasses import dataclass

from . import Event, event


@event
@dataclass(frozen=True, kw_only=True)
class SilentCorruption(Event):
    """Replicas that must hold identical state did not, found after ``step`` completed steps (the
    rank that writes it is the event's ``rank``; the replicas it suspects are ``suspect_ranks``).
    Verdict ``replayed``: what replaying the steps up to an earlier finding at ``step`` that named
    no replica found there (``replay``), recorded beside that finding's own event."""

    step: int
    verdict: str  # policy.sdc.ReplicaVerdict: odd_one_out | pair | split | replayed
    suspect_ranks: tuple[int, ...] = ()
    suspect_nodes: tuple[str, ...] = ()
    confidence: float = 0.0  # that the suspects' nodes caused it
    action: str = ""  # policy.sdc.SdcAction: rollback | halt (continue: a replay whose replicas agree)
    to_step: int = -1  # the checkpoint rolled back to (verified clean when saved); replayed: the one
    # the replay started from
    interval: int = 0  # steps between checks when it was found
    last_clean_step: int = -1  # the last check before this one that found the replicas identical
    tensors: tuple[str, ...] = ()  # the state tensors whose fingerprints differ (at most a few)
    evidence: tuple[str, ...] = ()  # each differing tensor's fingerprint per replica (replayed: in
    # the first run and in the replay)
    reason: str = ""
    replay: str = ""  # verdict replayed: policy.sdc.ReplayOutcome (transient, intermittent, ...)


@event
@dataclass(frozen=True, kw_only=True)
class TrainingAnomaly(Event):
    """A rank's training signal left its running range at ``step`` (policy/loss_anomaly.py): a
    loss or gradient norm that is not finite or spikes, or a run of steps the AMP gradient scaler
    skipped. A signal with its evidence, not an action: training goes on."""

    step: int
    signal: str  # policy.loss_anomaly.Signal: loss | grad_norm | scaler
    anomaly: str  # policy.loss_anomaly.AnomalyKind: nonfinite | spike | skip_run
    value: str  # as read ("nan", "inf", "3.412"): text, so a NaN stays valid JSON
    median: float = 0.0  # the running median it was judged against (0: none yet)
    mad: float = 0.0  # its median absolute deviation
    score: float = 0.0  # robust standard deviations above the median (spikes)
    window: int = 0  # values the median and MAD came from
    repeats: int = 0  # anomalous steps of this signal since its previous event, not recorded one by one
    reason: str = ""
