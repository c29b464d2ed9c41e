"""Mount points: present, a real mount, and answering ``stat`` within a deadline (hung NFS/Lustre)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .deadline import CallTimedOut, call_with_timeout


@dataclass(frozen=True)
class MountObservation:
    path: str
    exists: bool
    is_mount: bool | None = None
    stat_s: float | None = None
    timed_out: bool = False
    error: str = ""


def collect_mount(path: str, timeout_s: float = 2.0, *, clock=None) -> MountObservation:

    clock = clock or time.monotonic
    t0 = clock()
    try:
        exists, is_mount = call_with_timeout(
            lambda: (os.path.exists(path), os.path.ismount(path)), timeout_s, f"stat {path}"
        )
    except CallTimedOut:
        return MountObservation(path=path, exists=False, timed_out=True, stat_s=timeout_s)
    except OSError as exc:
        return MountObservation(path=path, exists=False, error=str(exc))
    return MountObservation(
        path=path, exists=exists, is_mount=is_mount if exists else None, stat_s=clock() - t0
    )


def collect_mounts(
    paths: list[str] | tuple[str, ...], timeout_s: float = 2.0
) -> tuple[MountObservation, ...]:
    return tuple(collect_mount(str(Path(p)), timeout_s) for p in paths)
