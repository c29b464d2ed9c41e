"""The soak's faults and plans (pure): which faults exist, where each is done, and a random plan.

A fault is done in one of three places (:class:`Venue`): inside the tool (the project's own chaos
plan, ``--chaos``), live by the harness to the running processes and files, or by the harness
between two jobs of a run's chain (damage a requeued job must survive).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path

from typing_extensions import assert_never

from ..policy.label import Label


class Venue(Label):
    INSIDE = "inside"  # the tool's own chaos plan (``--chaos``)
    LIVE = "live"  # done by the harness to the live processes and files
    BETWEEN = "between"  # done by the harness to the files between two jobs


class SoakFault(Label):
    """A soak fault; the inside ones carry the names of the chaos plan's faults."""

    CRASH = "crash"
    EXIT = "exit"
    HANG = "hang"
    KILL_AGENT = "kill-agent"
    CORRUPT_CHECKPOINT = "corrupt-checkpoint"
    TRUNCATE_CHECKPOINT = "truncate-checkpoint"
    SIGKILL_WORKER = "sigkill-worker"
    SIGSTOP_WORKER = "sigstop-worker"
    SIGKILL_AGENT = "sigkill-agent"
    SIGTERM_REQUEUE = "sigterm-requeue"
    FULL_DISK = "full-disk"  # the checkpoint disk filled during the run, freed 3 s later
    FULL_DISK_EMERGENCY = "full-disk-emergency"  # filled, then SIGTERM: the emergency save hits it
    FULL_DISK_END = "full-disk-end"  # filled for the last saves (the final one included), never freed
    DELETE_CKPT_FILE = "delete-ckpt-file"
    TRUNCATE_CKPT_FILE = "truncate-ckpt-file"
    CORRUPT_MANIFEST = "corrupt-manifest"
    CORRUPT_LEDGER = "corrupt-ledger"

    @property
    def venue(self) -> Venue:
        match self:
            case (
                SoakFault.CRASH
                | SoakFault.EXIT
                | SoakFault.HANG
                | SoakFault.KILL_AGENT
                | SoakFault.CORRUPT_CHECKPOINT
                | SoakFault.TRUNCATE_CHECKPOINT
            ):
                return Venue.INSIDE
            case (
                SoakFault.SIGKILL_WORKER
                | SoakFault.SIGSTOP_WORKER
                | SoakFault.SIGKILL_AGENT
                | SoakFault.SIGTERM_REQUEUE
                | SoakFault.FULL_DISK
                | SoakFault.FULL_DISK_EMERGENCY
                | SoakFault.FULL_DISK_END
            ):
                return Venue.LIVE
            case (
                SoakFault.DELETE_CKPT_FILE
                | SoakFault.TRUNCATE_CKPT_FILE
                | SoakFault.CORRUPT_MANIFEST
                | SoakFault.CORRUPT_LEDGER
            ):
                return Venue.BETWEEN
            case _:
                assert_never(self)

    @property
    def fills_disk(self) -> bool:
        return self in (SoakFault.FULL_DISK, SoakFault.FULL_DISK_EMERGENCY, SoakFault.FULL_DISK_END)


INSIDE = tuple(k for k in SoakFault if k.venue is Venue.INSIDE)
LIVE = tuple(k for k in SoakFault if k.venue is Venue.LIVE)
BETWEEN = tuple(k for k in SoakFault if k.venue is Venue.BETWEEN)
KINDS = INSIDE + LIVE + BETWEEN
REQUEUE_CODES = (75, 76)
# faults that end a job from outside or on purpose, so that the chain goes on with a requeue
REQUEUERS = (
    SoakFault.KILL_AGENT,
    SoakFault.SIGKILL_AGENT,
    SoakFault.SIGTERM_REQUEUE,
    SoakFault.FULL_DISK_EMERGENCY,
)


@dataclass(frozen=True)
class SoakConfig:
    workdir: Path
    runs: int = 4
    nproc: int = 2
    steps: int = 24
    every: int = 4
    keep: int = 3
    seed: int = 0
    faults_per_run: tuple[int, int] = (1, 3)
    job_timeout_s: float = 240.0
    max_jobs: int = 6
    hang_floor_s: float = 2.0
    tmpfs_bytes: int = 12 << 20  # room for keep + 2 versions of the example (1.7 MB each)
    python: str = sys.executable


@dataclass(frozen=True)
class PlannedFault:
    kind: SoakFault  # also given as its name ("crash"): converted on construction
    step: int
    rank: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", SoakFault(self.kind))

    def flag(self) -> str:
        """The ``--chaos`` spec of an inside fault."""
        match self.kind:
            case SoakFault.KILL_AGENT:
                return f"kill-agent@node=0,step={self.step}"
            case SoakFault.CORRUPT_CHECKPOINT | SoakFault.TRUNCATE_CHECKPOINT:
                return f"{self.kind}@step={self.step}"
            case SoakFault.CRASH | SoakFault.EXIT | SoakFault.HANG:
                return f"{self.kind}@rank={self.rank},step={self.step}"
            case (
                SoakFault.SIGKILL_WORKER
                | SoakFault.SIGSTOP_WORKER
                | SoakFault.SIGKILL_AGENT
                | SoakFault.SIGTERM_REQUEUE
                | SoakFault.FULL_DISK
                | SoakFault.FULL_DISK_EMERGENCY
                | SoakFault.FULL_DISK_END
                | SoakFault.DELETE_CKPT_FILE
                | SoakFault.TRUNCATE_CKPT_FILE
                | SoakFault.CORRUPT_MANIFEST
                | SoakFault.CORRUPT_LEDGER
            ):
                raise ValueError(f"{self.kind} is done by the harness, not by the chaos plan")
            case _:
                assert_never(self.kind)


def draw_plan(rng: random.Random, cfg: SoakConfig) -> tuple[PlannedFault, ...]:
    """A random plan of 1..n faults of distinct kinds, at steps spread over the run."""
    n = rng.randint(*cfg.faults_per_run)
    kinds = rng.sample(KINDS, n)
    # at most one full-disk variant and one fault that ends the job from outside per run, so the
    # checks stay attributable
    disk = [k for k in kinds if k.fills_disk]
    kinds = [k for k in kinds if not k.fills_disk] + disk[:1]
    if any(k in BETWEEN for k in kinds) and not any(k in REQUEUERS for k in kinds):
        # damage between jobs needs a requeue
        kinds.append(rng.choice((SoakFault.SIGKILL_AGENT, SoakFault.SIGTERM_REQUEUE)))
    plan = []
    for k in kinds:
        if k is SoakFault.FULL_DISK_END:
            step = cfg.steps - cfg.every - 1  # the last two saves (the final one included) hit a full disk
        else:
            step = rng.randint(cfg.every + 1, cfg.steps - 3)
        plan.append(PlannedFault(k, step, rng.randrange(cfg.nproc)))
    return tuple(sorted(plan, key=lambda f: f.step))
