"""Checkpoint save/load with an atomic commit (minimal engine).

Layout: ``<root>/step-<NNNNNNNNN>/`` holding ``shared.pt`` (state common to all ranks, written by
rank 0), ``rank-<r>.pt`` (each rank's own state: RNG, data position) and ``MANIFEST.json``,
written last by rank 0 after every rank's files are durable. Saves are collective: every rank
calls ``save`` with the same step. Loading walks versions newest-first and takes the first that
verifies; every skipped version is reported with its reason.

The full engine (staging into pinned buffers, tiers, DCP sharding) keeps this interface.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..events import CheckpointCommitted, CheckpointLoaded, CheckpointRejected, Event
from .manifest import MANIFEST, FileEntry, Manifest, crc32_file, fsync_dir, verify, write_durable

_STEP_DIR = re.compile(r"^step-(\d{9})$")
Sink = Callable[[Event], None]


@dataclass(frozen=True)
class SaveResult:
    step: int
    path: Path
    stall_s: float
    bytes: int


@dataclass(frozen=True)
class LoadResult:
    step: int
    path: Path
    shared: dict[str, Any]
    rank_state: dict[str, Any] | None
    duration_s: float
    world_size: int


def _default_barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


class CheckpointManager:
    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        keep: int = 3,
        sink: Sink | None = None,
        barrier: Callable[[], None] | None = None,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep} would delete every checkpoint", "use keep >= 1")
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self._sink = sink or (lambda ev: None)
        self._barrier = barrier or _default_barrier
        self.root.mkdir(parents=True, exist_ok=True)

    # --- save ----------------------------------------------------------------------------------

    def save(self, step: int, shared: dict[str, Any] | None, rank_state: dict[str, Any] | None = None,
             *, emergency: bool = False) -> SaveResult:
        """Collective save. ``shared`` is taken from rank 0; ``rank_state`` from every rank."""
        t0 = time.perf_counter()
        final = self.root / step_dir_name(step)
        work = self.root / f".{step_dir_name(step)}.partial"
        if self.rank == 0:
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True)
        self._barrier()
        nbytes = 0
        try:
            if self.rank == 0 and shared is not None:
                nbytes += self._write_obj(work / "shared.pt", shared)
            if rank_state is not None:
                nbytes += self._write_obj(work / f"rank-{self.rank}.pt", rank_state)
        except OSError as exc:
            raise CheckpointError(f"checkpoint step {step} could not be written: {exc.strerror}",
                                  "free space or fix the checkpoint directory; older checkpoints are intact") from exc
        self._barrier()
        if self.rank == 0:
            files = {}
            for f in sorted(work.iterdir()):
                files[f.name] = FileEntry(f.stat().st_size, crc32_file(f))
            manifest = Manifest(step=step, world_size=self.world_size, files=files, created=time.time(),
                                meta={"emergency": emergency})
            write_durable(work / MANIFEST, manifest.to_json().encode())
            if final.exists():
                shutil.rmtree(final)
            os.replace(work, final)
            fsync_dir(self.root)
            self._retain()
        self._barrier()
        stall = time.perf_counter() - t0
        if self.rank == 0:
            self._sink(CheckpointCommitted(ts=time.time(), step=step, path=str(final), stall_s=stall,
                                           persist_s=0.0, bytes=nbytes, tier="disk", emergency=emergency))
        return SaveResult(step=step, path=final, stall_s=stall, bytes=nbytes)

    @staticmethod
    def _write_obj(path: Path, obj: Any) -> int:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getbuffer()
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return len(data)

    def _retain(self) -> None:
        """Keep the newest ``keep`` verified checkpoints; never delete the newest good one."""
        good = [p for _, p in self.versions() if (p / MANIFEST).exists()]
        for p in good[self.keep:]:
            shutil.rmtree(p, ignore_errors=True)

    # --- load ----------------------------------------------------------------------------------

    def versions(self) -> list[tuple[int, Path]]:
        """Committed-looking checkpoint directories, newest first."""
        out = []
        for p in self.root.iterdir() if self.root.exists() else ():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
        return sorted(out, reverse=True)

    def latest_good(self) -> tuple[Manifest, Path] | None:
        for step, path in self.versions():
            manifest, reason = verify(path)
            if manifest is not None:
                return manifest, path
            self._sink(CheckpointRejected(ts=time.time(), path=str(path), reason=reason, step=step))
        return None

    def load_latest(self) -> LoadResult | None:
        """Load the newest checkpoint that verifies, or None if there is none."""
        t0 = time.perf_counter()
        found = self.latest_good()
        if found is None:
            return None
        manifest, path = found
        shared = torch.load(path / "shared.pt", weights_only=False) if "shared.pt" in manifest.files else {}
        rank_file = f"rank-{self.rank}.pt"
        rank_state = torch.load(path / rank_file, weights_only=False) if rank_file in manifest.files else None
        duration = time.perf_counter() - t0
        if self.rank == 0:
            self._sink(CheckpointLoaded(ts=time.time(), step=manifest.step, path=str(path),
                                        duration_s=duration, tier="disk"))
        return LoadResult(step=manifest.step, path=path, shared=shared, rank_state=rank_state,
                          duration_s=duration, world_size=manifest.world_size)
