"""Checkpoint manifest: what a committed checkpoint holds, with sizes and checksums.

The manifest is written last, atomically (write to a temp file, fsync, rename, fsync the
directory). A checkpoint directory without a valid manifest is never loaded.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST.json"
FORMAT = "stalwart-checkpoint"
VERSION = 1
_CHUNK = 4 << 20


@dataclass(frozen=True)
class FileEntry:
    size: int
    crc32: int


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, FileEntry]
    created: float
    meta: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Manifest:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError("not a stalwart checkpoint manifest")
        if int(data.get("version", 0)) > VERSION:
            raise ValueError(f"manifest version {data['version']} is newer than this reader")
        files = {k: FileEntry(int(v["size"]), int(v["crc32"])) for k, v in data["files"].items()}
        return Manifest(
            step=int(data["step"]),
            world_size=int(data["world_size"]),
            files=files,
            created=float(data["created"]),
            meta=dict(data.get("meta", {})),
        )


def crc32_file(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def read_manifest(directory: Path) -> tuple[Manifest | None, str]:
    mpath = directory / MANIFEST
    if not mpath.exists():
        return None, "no manifest (save never committed)"
    try:
        return Manifest.from_json(mpath.read_text()), ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"unreadable manifest: {exc}"


def verify_files(
    directory: Path, manifest: Manifest, names: list[str] | None = None, *, checksums: bool = True
) -> str:
    """Check the listed files (all by default); return "" if intact, else the first reason."""
    for name in sorted(manifest.files) if names is None else names:
        entry = manifest.files[name]
        f = directory / name
        if not f.exists():
            return f"missing file {name}"
        size = f.stat().st_size
        if size != entry.size:
            return f"{name} has {size} bytes, manifest says {entry.size} (truncated or torn)"
        if checksums:
            crc = crc32_file(f)
            if crc != entry.crc32:
                return f"{name} checksum {crc:#010x} != {entry.crc32:#010x} (corrupted)"
    return ""


def verify(directory: Path) -> tuple[Manifest | None, str]:
    """Return ``(manifest, "")`` if every listed file is present and intact, else ``(None, reason)``."""
    manifest, reason = read_manifest(directory)
    if manifest is None:
        return None, reason
    reason = verify_files(directory, manifest)
    return (manifest, "") if not reason else (None, reason)
