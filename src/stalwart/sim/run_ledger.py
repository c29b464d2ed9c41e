"""Write one simulated trial as a ledger, with the events a real run leaves, so ``stalwart report``
can read a simulation exactly as it reads a measured run.

The trial is trial 0 of a run made with ``simulate(cfg, trace=True)``. Every cycle becomes an attempt:
``AttemptStarted`` when its recovery starts, ``CheckpointLoaded`` when the restore completes,
``TrainingResumed`` from the newest checkpoint, a ``StepCompleted`` per step of rank 0 (``step_s``
seconds; the last step before a failure or the end is cut short so the run phase ends exactly where
the simulator's does), a synchronous ``CheckpointCommitted`` at the end of every stall, and a
``FailureDetected`` with the fault's onset and step (the step it cut short, else the next to run). Restrictions: one checkpoint tier, strategies other than
``replica`` (the report has no notion of a replica group being away), no stragglers (a simulated
slowdown is a throughput share, not a set of slow steps).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TypedDict

from ..errors import ConfigError
from ..events import (
    AttemptStarted,
    CheckpointCommitted,
    CheckpointLoaded,
    CheckpointStaged,
    DecisionTaken,
    Event,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from ..ledger import LedgerWriter
from .book import TraceRow
from .engine import SimResult

NODE = "sim-0"
RUN_ID = "simulated"
EPOCH = 1_700_000_000.0  # an arbitrary wall-clock origin; the report only uses differences


class _Ids(TypedDict):
    """Who an attempt's events belong to."""

    run_id: str
    node: str
    attempt: int


def _check(result: SimResult, step_s: float) -> None:
    cfg = result.config
    if not result.trace:
        raise ConfigError("the simulation has no trace", "run simulate(cfg, trace=True)")
    if len(cfg.tiers) != 1:
        raise ConfigError("a simulated run can be written as a ledger for one checkpoint tier only")
    if any(t.persist_s > 0 for t in cfg.tiers):
        raise ConfigError("a simulation with a background persist cannot be written as a ledger yet")
    if cfg.strategy == "replica":
        raise ConfigError("a replica-level simulation cannot be written as a ledger")
    if (cfg.straggler_per_node_day > 0 and cfg.straggler_slowdown > 0) or cfg.slow_steps > 0:
        raise ConfigError("a simulation with stragglers cannot be written as a ledger")
    base = cfg.tiers[0].interval_s
    if not step_s > 0 or abs(base / step_s - round(base / step_s)) > 1e-9:
        raise ConfigError(
            f"step time {step_s:g} s must divide the checkpoint interval {base:g} s",
            "pick a step time that divides the interval",
        )


def events_of(result: SimResult, step_s: float) -> list[Event]:
    """The events of trial 0, in time order."""
    _check(result, step_s)
    cfg = result.config
    tier = cfg.tiers[0]
    horizon = cfg.horizon_s
    evs: list[Event] = [
        JobStarted(
            ts=EPOCH, script="simulated.py", nproc_per_node=cfg.gpus_per_node, run_id=RUN_ID, node=NODE
        )
    ]
    step = 0  # steps completed and committed; a failure rolls back to the newest commit
    for attempt, cyc in enumerate(result.trace):
        struck = step  # the step a failure strikes: the next to run, unless it cut one short
        t = EPOCH + cyc["start"]
        a: _Ids = {"run_id": RUN_ID, "node": NODE, "attempt": attempt}
        evs.append(AttemptStarted(ts=t, world_size=cfg.gpus, num_nodes=cfg.nodes, **a))
        if cyc["recovered"]:
            t += cyc["restart"] + cyc["restore"]
            evs.append(CheckpointLoaded(ts=t, step=step, path="sim", duration_s=cyc["restore"], rank=0, **a))
            if cyc["plan_stall"] > 0:
                t += cyc["plan_stall"]
                evs.append(
                    CheckpointCommitted(ts=t, step=step, path="sim", stall_s=cyc["plan_stall"], rank=0, **a)
                )
            evs.append(TrainingResumed(ts=t, step=step, rank=0, **a))
            t, step, struck = _run(evs, a, t, step, cyc, tier.interval_s, tier.stall_s, step_s)
        else:
            t += cyc["restart"]
        if cyc["failed"]:
            onset = EPOCH + cyc["start"] + cyc["until_failure"]
            detected = onset + cyc["detection"]
            evs.append(
                FailureDetected(
                    ts=detected,
                    failure="crash",
                    evidence=f"simulated {cyc['class']}",
                    onset=onset,
                    step=struck,
                    rank=0,
                    **a,
                )
            )
            evs.append(DecisionTaken(ts=detected, action="restart", reason="simulated", **a))
    evs.append(
        JobEnded(
            ts=EPOCH + horizon,
            verdict="simulated horizon reached",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
            run_id=RUN_ID,
            node=NODE,
        )
    )
    return sorted(evs, key=lambda e: e.ts)


def _run(
    evs: list[Event],
    a: _Ids,
    t: float,
    step: int,
    cyc: TraceRow,
    interval: float,
    stall: float,
    step_s: float,
) -> tuple[float, int, int]:
    """Steps and checkpoints of one run phase starting at ``t``; returns (end, step to resume from,
    the step the phase's end struck: the one cut short, else the next to run)."""
    end = t + cyc["run"]
    left = cyc["compute"]
    committed = step
    per_block = int(round(interval / step_s))
    while left > 1e-9:
        n_full = min(per_block, int(math.floor(left / step_s + 1e-9)))
        for _ in range(n_full):
            evs.append(StepCompleted(ts=t + step_s, step=step, start=t, duration=step_s, rank=0, **a))
            t += step_s
            step += 1
        left = max(0.0, left - n_full * step_s)
        if n_full < per_block:  # the run phase ends inside this interval
            if left > 1e-9:  # its last step, cut short by the failure or the end of the horizon
                evs.append(StepCompleted(ts=t + left, step=step, start=t, duration=left, rank=0, **a))
                t += left
                return t, (committed if cyc["failed"] and cyc["class"] != "planned" else step + 1), step
            break
        # a whole interval done: the stall follows (the run phase may end inside it)
        s = min(stall, max(end - t, 0.0))
        if s >= stall - 1e-9:
            t += stall
            evs.append(CheckpointCommitted(ts=t, step=step, path="sim", stall_s=stall, rank=0, **a))
            committed = step
        else:
            if not cyc["failed"] and s > 0:  # the horizon ends inside a save that is being staged
                evs.append(CheckpointStaged(ts=t + s, step=step, stall_s=s, rank=0, **a))
            t += s
            break
    return t, (committed if cyc["failed"] and cyc["class"] != "planned" else step), step


def write(result: SimResult, run_dir: str | os.PathLike[str], step_s: float) -> Path:
    """Write trial 0 as ``<run_dir>/ledger/sim.ledger``; return the ledger's path."""
    path = Path(run_dir) / "ledger" / "sim.ledger"
    evs = events_of(result, step_s)
    with LedgerWriter(path, writer="sim") as w:
        w.extend(evs)
    return path
