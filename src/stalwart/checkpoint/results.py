"""What a checkpoint save or load returns to the training SDK."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
