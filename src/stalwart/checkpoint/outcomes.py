"""What the checkpoint engine reports back: a save's ticket, a persist's per-tier commits, a load,
an emergency persist; and the parts the engine's save and load paths share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..events import Event
from .collective import Collective
from .node_tier import NodeLink
from .store import FileStore, FsspecStore

Sink = Callable[[Event], None]


@dataclass(frozen=True)
class TierCommit:
    tier: str
    ok: bool
    path: str
    persist_s: float
    reason: str = ""


@dataclass(frozen=True)
class PersistResult:
    step: int
    commits: tuple[TierCommit, ...]
    emergency: bool = False

    @property
    def committed(self) -> tuple[str, ...]:
        return tuple(c.tier for c in self.commits if c.ok)


@dataclass(frozen=True)
class SaveTicket:
    """What ``save`` did: the stall it caused and the background persist (if any)."""

    step: int
    stall_s: float
    bytes: int
    tiers: tuple[str, ...]
    future: Future[PersistResult] | None
    skipped: str = ""


@dataclass(frozen=True)
class EngineLoad:
    step: int
    path: str
    tier: str
    rank_state: Any  # Any: a per-rank object of the user's, anything torch.save pickles
    duration_s: float
    world_size: int
    rejected: tuple[str, ...] = ()
    local_path: str = ""  # where the verified files are on this machine (fetched for object tiers)
    rank_state_from: int = -1  # the saved rank whose extras these are (differs after a world-size change)


@dataclass(frozen=True)
class EmergencyResult:
    step: int
    committed: bool
    tier: str
    duration_s: float
    reason: str


class DurableMark:
    """The newest step known to be on a durable tier; raised from the persist thread, read by the
    emergency path on the training thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._step: int | None = None

    @property
    def step(self) -> int | None:
        with self._lock:
            return self._step

    def raise_to(self, step: int) -> None:
        with self._lock:
            self._step = max(self._step if self._step is not None else -1, step)

    def covers(self, step: int) -> bool:
        current = self.step
        return current is not None and current >= step


@dataclass(frozen=True)
class EngineParts:
    """What the save path and the load path of one engine share: where this rank sits, its
    collectives, one store per tier, the event sink and the clocks (``clock`` for durations,
    ``wall`` for event timestamps)."""

    rank: int
    world_size: int
    comm: Collective
    link: NodeLink
    stores: dict[str, FileStore | FsspecStore]
    sink: Sink
    clock: Callable[[], float]
    wall: Callable[[], float]
    durable: DurableMark = field(default_factory=DurableMark)

    def gather_reasons(self, reason: str) -> list[str]:
        """Collective: every rank's non-empty reason, prefixed with its rank."""
        return [f"rank {r}: {x}" for r, x in enumerate(self.comm.all_gather_str(reason)) if x]
