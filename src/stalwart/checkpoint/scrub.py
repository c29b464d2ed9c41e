"""Background verification of committed checkpoints, the file side: read one committed version
against its manifest, tell whether it is still the version that was listed, and set a damaged one
aside so that no listing (and so no recovery, and no retention) sees it again.

What to read and when, and what a reading means, is decided in policy/checkpoint_scrub.py; the
agent's thread that runs it is launch/checkpoint_scrub.py.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..policy.checkpoint_scrub import SETTLE_S, Identity, Reading
from .manifest import MANIFEST, read_manifest, verify_files

DAMAGED = ".damaged"  # a set-aside version: ``.step-<N>.damaged`` beside the tier's versions


def identity(version: Path) -> Identity | None:
    """The identity of the committed version at ``version`` (None: not there, or not a directory
    with a manifest). Never follows a link."""
    try:
        d = os.stat(version, follow_symlinks=False)
        m = os.stat(version / MANIFEST, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISDIR(d.st_mode) or not stat.S_ISREG(m.st_mode):
        return None
    return Identity(d.st_ino, m.st_ino, m.st_mtime_ns, m.st_size)


@dataclass(frozen=True)
class Read:
    reading: Reading
    bytes: int  # bytes of the files checked


def read_version(
    version: Path,
    key: bytes | None,
    *,
    present_only: bool = False,
    settle: Callable[[], None] = lambda: time.sleep(SETTLE_S),
) -> Read:
    """Check every file of ``version`` (the MAC with ``key``, then each file's size and SHA-256).
    ``present_only``: check only the files that are here (a node-local tier holds this node's files;
    the others are on their own nodes). After a problem, wait ``settle`` before the identity is taken
    again: a version that retention or a new save of its step was removing is then seen as gone."""
    before = identity(version)
    manifest, problem = read_manifest(version, key)
    size = 0
    if manifest is not None:
        names = sorted(manifest.files)
        if present_only:
            names = [n for n in names if (version / n).exists()]
        size = sum(manifest.files[n].size for n in names)
        problem = verify_files(version, manifest, names)
    if problem:
        settle()
    return Read(Reading(problem, before, identity(version)), size)


def set_aside(version: Path) -> Path:
    """Move ``version`` (``step-<N>``) to ``.step-<N>.damaged`` beside it, where no listing looks; an
    earlier damaged copy of the same step is replaced. Returns the new place. OSError if it cannot."""
    dest = version.with_name(f".{version.name}{DAMAGED}")
    if dest.exists():
        shutil.rmtree(dest, ignore_errors=True)
    os.replace(version, dest)
    return dest
