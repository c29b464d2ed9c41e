"""Synthetic run ledgers for tests, demos and benchmarks of the observability layer.

Writes what an agent and its ranks would: job and attempt events, steps on every rank (one of them
slower: a straggler), periodic checkpoints, crashes answered by restarts, health checks. Times are
explicit (no clock is read), so the output is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..events import (
    AttemptStarted,
    CheckpointCommitted,
    CheckpointLoaded,
    DecisionTaken,
    Event,
    FailureDetected,
    JobEnded,
    JobStarted,
    StepCompleted,
    TrainingResumed,
)
from ..events.node_health import HealthChecked
from ..ledger import LedgerWriter


@dataclass(frozen=True)
class SyntheticRun:
    ranks: int = 2
    steps: int = 60
    step_s: float = 0.1
    straggler_rank: int = 1
    straggler_factor: float = 1.6
    crash_steps: tuple[int, ...] = (30,)  # a crash of rank 0 after each of these steps
    checkpoint_every: int = 10
    t0: float = 1_700_000_000.0
    node: str = "node0"
    run_id: str = "synthetic"
    ended: bool = True
    health_findings: tuple[dict, ...] = ()


def events(spec: SyntheticRun) -> Iterator[Event]:
    """The events of ``spec`` in time order."""

    rid, node = spec.run_id, spec.node
    t = spec.t0
    yield JobStarted(
        ts=t,
        script="train.py",
        nproc_per_node=spec.ranks,
        max_restarts=len(spec.crash_steps),
        run_id=rid,
        node=node,
    )
    status = "warn" if spec.health_findings else "pass"
    yield HealthChecked(
        ts=t + 0.05,
        level="passive",
        status=status,
        action="none",
        reason="synthetic",
        findings=spec.health_findings,
        run_id=rid,
        node=node,
    )
    attempt, step, last_ckpt = 0, 0, -1
    crashes = list(spec.crash_steps)
    t += 0.5
    yield AttemptStarted(ts=t, attempt=attempt, world_size=spec.ranks, run_id=rid, node=node)
    while step < spec.steps:
        t += 0.2  # per-attempt start-up
        for rank in range(spec.ranks):
            dur = spec.step_s * (spec.straggler_factor if rank == spec.straggler_rank else 1.0)
            own = dur * 0.8
            yield StepCompleted(
                ts=t + spec.step_s,
                rank=rank,
                attempt=attempt,
                step=step,
                start=t,
                duration=spec.step_s if rank != spec.straggler_rank else dur,
                sections={"forward": own, "allreduce": dur - own},
                run_id=rid,
                node=node,
            )
        t += spec.step_s
        if spec.checkpoint_every and (step + 1) % spec.checkpoint_every == 0:
            t += 0.02
            yield CheckpointCommitted(
                ts=t,
                rank=0,
                attempt=attempt,
                step=step,
                path=f"ckpt/step-{step}",
                stall_s=0.02,
                persist_s=0.05,
                bytes=1 << 20,
                run_id=rid,
                node=node,
            )
            last_ckpt = step
        if crashes and step == crashes[0]:
            crashes.pop(0)
            onset = t + 0.01
            yield FailureDetected(
                ts=onset + 0.3,
                rank=0,
                attempt=attempt,
                failure="crash",
                onset=onset,
                step=step,
                evidence="rank 0 exited with SIGKILL",
                exit_code=-9,
                signal="SIGKILL",
                run_id=rid,
                node=node,
            )
            yield DecisionTaken(
                ts=onset + 0.35,
                attempt=attempt,
                action="restart",
                reason="restart: rank 0 crashed",
                restarts_used=attempt + 1,
                restarts_allowed=len(spec.crash_steps),
                run_id=rid,
                node=node,
            )
            attempt += 1
            t = onset + 0.5
            yield AttemptStarted(ts=t, attempt=attempt, world_size=spec.ranks, run_id=rid, node=node)
            step = last_ckpt + 1
            yield CheckpointLoaded(
                ts=t + 0.1,
                rank=0,
                attempt=attempt,
                step=last_ckpt,
                path=f"ckpt/step-{last_ckpt}",
                duration_s=0.05,
                run_id=rid,
                node=node,
            )
            yield TrainingResumed(ts=t + 0.15, rank=0, attempt=attempt, step=step, run_id=rid, node=node)
            t += 0.15
            continue
        step += 1
    if spec.ended:
        yield JobEnded(
            ts=t + 0.3,
            verdict="finished",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
            attempt=attempt,
            run_id=rid,
            node=node,
        )


def write(run_dir: str | Path, spec: SyntheticRun, *, batch: int = 5000) -> Path:
    """Write ``spec`` as one agent ledger under ``run_dir/ledger``; returns the ledger file."""
    path = Path(run_dir) / "ledger" / f"agent-{spec.node}.ledger"
    with LedgerWriter(path, writer="synthetic") as w:
        buf: list[Event] = []
        for ev in events(spec):
            buf.append(ev)
            if len(buf) >= batch:
                w.extend(buf)
                buf.clear()
        w.extend(buf)
    return path
