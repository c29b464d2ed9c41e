"""Fit the simulator to a real run: failure rate, detection, recovery and checkpoint stall from a ledger."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..account.reliability import Interruption, failure_rates, interruptions_from_events, mttr
from ..errors import LedgerError
from ..events import ChaosInjected, CheckpointCommitted, CheckpointLoaded, Event
from ..ledger import read_merged
from .config import CheckpointTier, FailureClass, SimConfig, make_config
from .evidence import RateEvidence, RateSource, judge_rates
from .units import duration, number


@dataclass(frozen=True)
class MeasuredConfig:
    cfg: SimConfig
    notes: list[str]
    rates: RateEvidence  # whether the failure rates are the run's own or the published ones, and why


def config_from_events(
    events: Sequence[Event], base: SimConfig, *, faults_are_tests: bool = False, force_published: str = ""
) -> MeasuredConfig:
    """``base`` with the times measured in ``events``, and its failure rates where the run's failures
    are evidence of a rate (``sim/evidence.py``); ``force_published``: a reason to keep the published
    rates regardless. Notes say what was replaced."""
    run = interruptions_from_events(events)
    notes: list[str] = []
    # every interruption counts, the script's own exceptions too: the published table whose rates
    # these scale counts software bugs among its unexpected interruptions
    infra = list(run.interruptions)
    values = base.model_dump()
    if run.exposure.gpu_hours <= 0:
        raise LedgerError(
            "the ledger has no attempt with a world size, so no exposure to measure rates over",
            "point at the run directory of a run that started workers",
        )
    injected = sum(1 for e in events if isinstance(e, ChaosInjected))
    rates = judge_rates(len(infra), run.exposure.gpu_hours, injected=injected, marked_tests=faults_are_tests)
    if force_published:
        rates = RateEvidence(RateSource.PUBLISHED, force_published)
    notes.append(rates.reason)
    if infra and rates.source is RateSource.MEASURED:
        measured = failure_rates(len(infra), run.exposure).per_1000_gpu_days
        total = sum(f.per_1000_gpu_days for f in base.failures)
        factor = measured / total if total > 0 else 0.0
        values["failures"] = [
            FailureClass(**{**f.model_dump(), "per_1000_gpu_days": f.per_1000_gpu_days * factor}).model_dump()
            for f in base.failures
        ]
        notes.append(
            f"failure rate {number(measured)} per 1000 GPU-days from {len(infra)} interruptions in "
            f"{run.exposure.gpu_hours:,.1f} GPU-hours (class mix kept from the default table)"
        )
    if infra:
        _measured_times(infra, values, notes)
    stalls = [e.stall_s for e in events if isinstance(e, CheckpointCommitted) and not e.emergency]
    loads = [e.duration_s for e in events if isinstance(e, CheckpointLoaded)]
    tiers = [CheckpointTier(**t) for t in values["tiers"]]
    durable = min((t for t in tiers if t.survives_node_loss), key=lambda t: t.interval_s)
    repl = {}
    if stalls:
        repl["stall_s"] = sum(stalls) / len(stalls)
        notes.append(f"checkpoint stall {duration(repl['stall_s'])} (mean of {len(stalls)} commits)")
    if values["job_restart_s"] != base.job_restart_s or (infra and mttr(infra).recover_s is not None):
        # the measured restart (decision -> first step) already includes the restore
        repl["restore_s"] = 0.0
    elif loads:
        repl["restore_s"] = sum(loads) / len(loads)
    values["tiers"] = [{**t.model_dump(), **(repl if t.name == durable.name else {})} for t in tiers]
    return MeasuredConfig(make_config(**values), notes, rates)


# Any: the settings SimConfig validates, as YAML and flags gave them
def _measured_times(infra: Sequence[Interruption], values: dict[str, Any], notes: list[str]) -> None:
    """The run's detection, decision and restart times into ``values``, whichever rates are planned."""
    m = mttr(infra)
    if m.detect_s is not None:
        values["failures"] = [{**f, "detect_s": m.detect_s} for f in values["failures"]]
        notes.append(f"detection latency {duration(m.detect_s)} (measured mean, all classes)")
    if m.decide_s is not None:
        values["decide_s"] = m.decide_s
    if m.recover_s is not None:
        values["job_restart_s"] = m.recover_s
        notes.append(
            f"restart {duration(m.recover_s)} (measured mean decision -> first step, restore included)"
        )


def config_from_ledger(location: str | os.PathLike[str], base: SimConfig) -> MeasuredConfig:
    return config_from_events(read_merged(location), base)
