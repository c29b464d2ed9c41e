"""Private directories in a shared place (``/dev/shm``), opened so that a plant cannot redirect them.

Another local user can create ``/dev/shm/stalwart-<uid>-<run id>`` before the run does (the run id is
predictable): as a symbolic link to a directory of ours, or as a directory of theirs that they may
then rearrange. Every directory here is therefore created or opened by name relative to an already
verified directory's descriptor, with ``O_NOFOLLOW | O_DIRECTORY`` (a link is refused by the kernel,
never followed), and checked on that descriptor: owned by this user and no permission for group or
others (0700). Removal goes through the same descriptors (``shutil.rmtree`` with ``dir_fd``, which
never follows a link), so nothing is removed through a path that was not verified.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import CheckpointError
from ..protocol.private_paths import PathRefused, open_dir


class ForeignDirError(CheckpointError):
    """The directory is a link, not a directory, or another user's: someone else may have put it there."""


def _refuse(path: Path, why: str, error: type[CheckpointError] = CheckpointError) -> CheckpointError:
    return error(
        f"memory tier directory {path} {why}; it could have been planted by another user",
        f"remove {path} (or set STALWART_SHM_DIR to a directory only you can write) and start again",
    )


def open_private(parent_fd: int, name: str, shown: Path, *, create: bool = True) -> int:
    """A descriptor of directory ``name`` in ``parent_fd``, created 0700 when missing (``create``),
    refused (:class:`CheckpointError`) when it is a link, not a directory, not ours or writable by
    others (:func:`stalwart.protocol.private_paths.open_dir`: read bits are taken back to 0700)."""
    try:
        return open_dir(parent_fd, name, shown, create=create)
    except PathRefused as exc:
        raise _refuse(shown, exc.why, ForeignDirError if exc.foreign else CheckpointError) from None
    except OSError as exc:
        raise CheckpointError(
            f"cannot create or open memory tier directory {shown}: {exc.strerror}",
            "set STALWART_SHM_DIR to a writable tmpfs directory you own",
        ) from None


def open_claimed(base_fd: int, base: Path, name: str) -> tuple[int, Path, str]:
    """The directory ``name`` in ``base`` (created 0700 when missing, verified as
    :func:`open_private` does), or, when ``name`` is taken by another user or is a link (a
    predictable name someone planted), a fresh directory of an unpredictable name beside it
    (``<name>-<random>``, created 0700 by this user). Returns its descriptor, its path and a note
    saying why another name was used ("" when ``name`` itself was)."""
    shown = base / name
    try:
        return open_private(base_fd, name, shown), shown, ""
    except ForeignDirError as exc:
        why = exc.message.removeprefix("memory tier directory ")
    try:
        made = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    except OSError as exc:
        raise CheckpointError(
            f"cannot create a memory tier directory in {base}: {exc.strerror}",
            "set STALWART_SHM_DIR to a writable tmpfs directory",
        ) from None
    note = f"memory tier in {made} instead: {why}; remove {shown} to use the usual name again"
    return open_private(base_fd, made.name, made, create=False), made, note


def open_base(path: Path) -> int:
    """The shared base directory itself (``/dev/shm``, or ``STALWART_SHM_DIR``, created 0700 with
    its missing parents when it does not exist): opened as given (it is the system's or the user's)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise CheckpointError(
            f"cannot open {path} for the memory tier: {exc.strerror}",
            "set STALWART_SHM_DIR to a tmpfs directory",
        ) from None


def remove_private(parent_fd: int, name: str, shown: Path) -> None:
    """Remove directory ``name`` of ``parent_fd`` and everything below it, after verifying it as
    :func:`open_private` does; links inside are removed, never followed. Missing: nothing to do."""
    try:
        fd = open_private(parent_fd, name, shown, create=False)
    except CheckpointError:
        if not _exists(parent_fd, name):
            return
        raise
    os.close(fd)
    shutil.rmtree(name, dir_fd=parent_fd)


def _exists(parent_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    return True
