"""What the supervisor knows at one tick, frozen: the input of every monitor.

The supervisor gathers a :class:`Snapshot` each tick from its collectors (worker exits, the workers'
messages and heartbeats as a :class:`~stalwart.launch.progress.ProgressTracker`, CPU samples of
workers without the SDK, the rendezvous' waiting nodes, the signals the agent received) and hands it
to the monitors. A monitor reads only the snapshot, so a test or the simulator can build one by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from ..diagnose.kill_cause import KillVerdict
from ..events import StepCompleted
from ..health.link_counters import LinkSample
from ..policy.world_size import WorldPlan
from ..protocol import CheckpointDone
from ..protocol.error_record import ErrorRecord
from .cpu_progress import CpuProgress
from .progress import ProgressTracker, RankProgress

K = TypeVar("K")
V = TypeVar("V")

# Any: one empty mapping shared as the default of fields of every key and value type
_EMPTY: Mapping[Any, Any] = MappingProxyType({})


# Any: as _EMPTY, so each field's default takes the field's own type
def _empty() -> Mapping[Any, Any]:
    return _EMPTY


@dataclass(frozen=True)
class RankView:
    """One rank's progress at the tick (a frozen copy of the tracker's ``RankProgress``)."""

    rank: int
    last_msg: float
    step: int = -1
    section: str | None = None
    done_steps: int = 0
    finished: bool = False
    in_checkpoint: bool = False
    sdk: bool = False
    phase: str = ""
    phase_budget_s: float = 0.0
    phase_t0: float = 0.0
    loop_done: bool = False
    session: bool = False  # the rank runs the SDK's Session (said Hello)
    finished_at: float = 0.0  # when the rank said its training finished

    @classmethod
    def of(cls, p: RankProgress) -> RankView:
        return cls(
            p.rank,
            p.last_msg,
            p.step,
            p.section,
            p.done_steps,
            p.finished,
            p.in_checkpoint,
            p.sdk,
            p.phase,
            p.phase_budget_s,
            p.phase_t0,
            p.loop_done,
            p.session,
            p.finished_at,
        )


@dataclass(frozen=True)
class CpuMark:
    """A worker without the SDK: since when it made no CPU progress, and its process state."""

    since: float
    state: str = "R"


@dataclass(frozen=True)
class Snapshot:
    now: float
    tick: float  # the monitor interval: a hang is declared up to one tick early, never late
    node: str
    started: float  # when this attempt's workers were started
    ranks: tuple[RankView, ...]
    codes: Mapping[int, int | None]  # rank -> exit code, None while running
    exit_times: Mapping[int, float] = field(default_factory=_empty)
    errors: Mapping[int, ErrorRecord | None] = field(
        default_factory=_empty
    )  # error records of the failed ranks
    step_times: tuple[float, ...] = ()
    max_done_step: int = -1
    preempted_ranks: frozenset[int] = frozenset()
    durability: Mapping[int, CheckpointDone] = field(
        default_factory=_empty
    )  # rank -> its emergency or final save
    signal: int | None = None  # the newest signal the agent received
    stop_requested_at: float | None = None
    nodes_waiting: int | None = None  # None: not asked at this tick
    store_unreachable: str = ""  # why the rendezvous store counts as gone ("" while it answers)
    cpu: Mapping[int, CpuMark] = field(default_factory=_empty)  # workers without the SDK only
    recent_steps: tuple[StepCompleted, ...] = ()  # the straggler window
    straggler_step: int = -1  # >= 0: the step at which the straggler window is due for a check
    stragglers: Mapping[int, float] = field(
        default_factory=_empty
    )  # rank -> score of the ranks flagged so far
    attempt: int = 0
    world: WorldPlan | None = None  # this attempt's nodes (for the straggler-action policy)
    hosts: str = ""  # the stores this node's agent serves that the others need ("": none; JobLink)
    total_steps: int = 0  # the steps the script announced (0: unknown)
    kills: Mapping[int, KillVerdict] = field(default_factory=_empty)  # failed ranks killed by a signal
    link: tuple[LinkSample, ...] = ()  # this host's link counters, oldest first (the slow-link check)
    slow_links: frozenset[int] = frozenset()  # ranks whose silence was raised as a slow link (once)

    # --- derived views ------------------------------------------------------------------------

    @property
    def progress(self) -> dict[int, RankView]:
        return {r.rank: r for r in self.ranks}

    @property
    def sdk_ranks(self) -> list[int]:
        return [r.rank for r in self.ranks if r.sdk]

    @property
    def session_ranks(self) -> list[int]:
        """Ranks running the SDK's Session (a coordinated stop applies to them)."""
        return [r.rank for r in self.ranks if r.session]

    @property
    def steps_seen(self) -> bool:
        return any(r.done_steps for r in self.ranks)

    @property
    def in_checkpoint(self) -> bool:
        return any(r.in_checkpoint for r in self.ranks)

    @property
    def wrapping_up(self) -> bool:
        """A live rank is past its loop's last step: the script's own code after the loop runs."""
        return any(r.loop_done for r in self.ranks if not r.finished)

    @property
    def max_step_in_progress(self) -> int:
        return max((r.step for r in self.ranks), default=-1)

    @property
    def failed(self) -> dict[int, int]:
        return {r: c for r, c in self.codes.items() if c not in (None, 0)}

    @property
    def all_exited(self) -> bool:
        return all(c is not None for c in self.codes.values())


def views(tracker: ProgressTracker) -> tuple[RankView, ...]:
    return tuple(RankView.of(p) for p in tracker.progress.values())


def cpu_marks(cpu: Mapping[int, CpuProgress]) -> Mapping[int, CpuMark]:
    return MappingProxyType({r: CpuMark(p.since, p.state) for r, p in cpu.items()})


def frozen(mapping: Mapping[K, V]) -> Mapping[K, V]:
    return MappingProxyType(dict(mapping))
