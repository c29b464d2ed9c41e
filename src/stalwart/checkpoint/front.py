"""The training SDK's checkpoint interface on top of the engine.

``save``/``load_latest``/``versions``/``latest_good``: ``save`` returns after staging (its
``stall_s`` is the stage time) and the files are committed in the background; ``wait()`` blocks
until they are; ``save(..., emergency=True)`` blocks until durable. ``shared`` is taken from
rank 0 and ``rank_state`` from each rank, both kept exactly (torch.save of the staged copies).
Optional extra tiers (memory, shared filesystem, object store) come from ``tiers``; the first
local tier is always ``root`` so ``versions()`` lists ``root/step-<N>`` as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..events import Event
from .engine import CheckpointEngine, EmergencyResult
from .manifest import Manifest, verify
from .results import LoadResult, SaveResult
from .store import FileStore, step_name
from .tiers import TierConfig

_SHARED = "__stalwart_shared__"


class EngineCheckpointManager:
    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        keep: int = 3,
        sink: Callable[[Event], None] | None = None,
        barrier: Callable[[], None] | None = None,
        tiers: Sequence[TierConfig] = (),
        process_group: Any = None,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep} would delete every checkpoint", "use keep >= 1")
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self._sink = sink or (lambda ev: None)
        local = TierConfig(name="local", kind="local", location=str(self.root), keep=keep)
        self.engine = CheckpointEngine(
            [local, *tiers],
            rank=rank,
            world_size=world_size,
            sink=self._sink,
            process_group=process_group,
            on_busy="wait",
        )
        self._store = FileStore(self.root)

    def save(
        self,
        step: int,
        shared: dict[str, Any] | None,
        rank_state: dict[str, Any] | None = None,
        *,
        emergency: bool = False,
    ) -> SaveResult:
        """Collective. Returns after the state is staged; the persist runs in the background."""
        payload: dict[str, Any] = {"rank": rank_state}
        if self.rank == 0:
            payload[_SHARED] = shared
        ticket = self.engine.save(step, {}, payload, force=True, emergency=emergency)
        if emergency:
            res = self.engine.wait()
            if res is None or not res.committed:
                raise CheckpointError(
                    f"emergency checkpoint of step {step} was not committed",
                    "see the CheckpointPersistFailed event for the cause",
                )
        return SaveResult(step=step, path=self._store.final(step), stall_s=ticket.stall_s, bytes=ticket.bytes)

    def wait(self) -> None:
        self.engine.wait()

    def emergency_persist(self, deadline_s: float) -> EmergencyResult:
        return self.engine.emergency_persist(deadline_s)

    def close(self) -> None:
        self.engine.close()

    def versions(self) -> list[tuple[int, Path]]:
        return self._store.versions()

    def latest_good(self) -> tuple[Manifest, Path] | None:
        for _, path in self.versions():
            manifest, _ = verify(path)
            if manifest is not None:
                return manifest, path
        return None

    def load_latest(self) -> LoadResult | None:
        t0 = time.perf_counter()
        got = self.engine.load_latest({})
        if got is None:
            return None
        mine = got.rank_state or {}
        if self.rank == 0 and _SHARED in mine:
            shared = mine[_SHARED]
        else:
            zero = Path(got.local_path) / "rank-0.pt"
            shared = torch.load(zero, weights_only=False).get(_SHARED) if zero.exists() else None
        return LoadResult(
            step=got.step,
            path=Path(got.path),
            shared=shared or {},
            rank_state=mine.get("rank"),
            duration_s=time.perf_counter() - t0,
            world_size=got.world_size,
        )

    def path_for(self, step: int) -> Path:
        return self.root / step_name(step)
