"""Agent-side chaos actions on checkpoints: damage the newest committed one on purpose."""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoint.manifest import MANIFEST


def newest_checkpoint(root: Path) -> Path | None:
    if not root.exists():
        return None
    dirs = sorted((p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).exists()), key=lambda p: p.name)
    return dirs[-1] if dirs else None


def _largest_file(ckpt: Path) -> Path:
    files = [p for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST]
    return max(files, key=lambda p: p.stat().st_size)


def damage(ckpt: Path, kind: str) -> str:
    """Flip bytes in (``corrupt-checkpoint``) or truncate (``truncate-checkpoint``) the largest file."""
    target = _largest_file(ckpt)
    size = target.stat().st_size
    if kind == "truncate-checkpoint":
        os.truncate(target, size // 2)
        return f"truncated {target.relative_to(ckpt.parent)} from {size} to {size // 2} bytes"
    with open(target, "r+b") as fh:
        fh.seek(size // 2)
        chunk = bytearray(fh.read(16))
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
    return f"flipped {len(chunk)} bytes at offset {size // 2} of {target.relative_to(ckpt.parent)}"
