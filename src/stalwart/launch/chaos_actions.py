"""Agent-side chaos actions on checkpoints: damage the newest committed one on purpose."""

from __future__ import annotations

import os
import re
from pathlib import Path

from typing_extensions import assert_never

from ..chaos.plan import FaultKind
from ..checkpoint.manifest import MANIFEST
from ..checkpoint.store import step_name

_PARTIAL = re.compile(r"^\.step-(\d+)\.partial$")
_VERSION = re.compile(r"^step-(\d+)$")


def newest_checkpoint(root: Path) -> Path | None:
    if not root.exists():
        return None
    dirs = sorted((p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).exists()), key=lambda p: p.name)
    return dirs[-1] if dirs else None


def _steps(root: Path) -> tuple[list[int], list[int]]:
    """(committed, being written) version steps under ``root``."""
    if not root.is_dir():
        return [], []
    names = [p.name for p in root.iterdir() if p.is_dir()]
    done = [int(m.group(1)) for n in names if (m := _VERSION.match(n)) and (root / n / MANIFEST).exists()]
    return done, [int(m.group(1)) for n in names if (m := _PARTIAL.match(n))]


def newest_on_its_way(target: Path, others: list[Path]) -> int:
    """The newest version step committed or being written (a ``.step-<N>.partial`` directory) in
    ``target`` or a faster tier (``others``, e.g. the node memory tier, which commits first); -1 if
    none. Damage aimed at "the newest version" pins this step: a version still in flight when the
    fault is due is the one a restart would read once it commits."""
    steps: list[int] = []
    for root in (target, *others):
        done, writing = _steps(root)
        steps += done + writing
    return max(steps, default=-1)


def newest_committed(target: Path, others: list[Path]) -> int:
    """The newest version step committed in ``target`` or a faster tier (``others``); -1 if none:
    with the workers gone, the version a restart reads."""
    return max((step for root in (target, *others) for step in _steps(root)[0]), default=-1)


def committed(root: Path, step: int) -> Path | None:
    """``root``'s committed version of ``step``, if it is there."""
    path = root / step_name(step)
    return path if (path / MANIFEST).exists() else None


def _largest_file(ckpt: Path) -> Path:
    files = [p for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST]
    return max(files, key=lambda p: p.stat().st_size)


def damage(ckpt: Path, kind: FaultKind | str, tier: str = "") -> str:
    """Flip bytes in (``corrupt-checkpoint``) or truncate (``truncate-checkpoint``) the largest file;
    what was done, after the tier's name when given (two copies of one version read alike otherwise)."""
    fault = FaultKind(kind)
    where = f"{tier} tier: " if tier else ""
    match fault:
        case FaultKind.TRUNCATE_CHECKPOINT:
            return where + _truncate(ckpt)
        case FaultKind.CORRUPT_CHECKPOINT:
            return where + _flip(ckpt)
        case (
            FaultKind.CRASH
            | FaultKind.EXIT
            | FaultKind.RAISE
            | FaultKind.HANG
            | FaultKind.SLOW
            | FaultKind.KILL_AGENT
            | FaultKind.BITFLIP
        ):
            raise ValueError(f"fault {fault.value!r} does not damage a checkpoint")
        case _:
            assert_never(fault)


def _truncate(ckpt: Path) -> str:
    target = _largest_file(ckpt)
    size = target.stat().st_size
    os.truncate(target, size // 2)
    return f"truncated {target.relative_to(ckpt.parent)} from {size} to {size // 2} bytes"


def _flip(ckpt: Path) -> str:
    target = _largest_file(ckpt)
    size = target.stat().st_size
    with open(target, "r+b") as fh:
        fh.seek(size // 2)
        chunk = bytearray(fh.read(16))
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
    return f"flipped {len(chunk)} bytes at offset {size // 2} of {target.relative_to(ckpt.parent)}"
