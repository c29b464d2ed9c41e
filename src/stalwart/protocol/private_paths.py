"""Private directories and files that another local user cannot redirect (run directories, logs).

A root run writes where another user may have been first: ``<--log-dir>/<run id>/attempt_N/...`` or
``stalwart-runs/<run id>`` can be created in advance, or be a symbolic link to a file of root's.
So the directory the user names (the *root*) is opened without following a link there and must be
this user's (and not writable by others unless sticky), and every level below it is created by
name relative to the verified level above (``mkdir`` 0700, then ``open`` with ``O_NOFOLLOW |
O_DIRECTORY``) and checked on its descriptor: this user's, no write permission for group or others
(read or search permission left by an older version is taken away: 0700). Files are created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` at 0600 in a verified directory; an existing one is opened
without following a link and must be a regular file of this user's with one link.

Everything refused is one :class:`PathRefused` that names what to remove. The path up to the root
is the user's choice and followed as given (missing directories are created 0700), except a
symbolic link on it that another user (not root) made: that is refused too.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class PathRefused(ConfigError):
    """A directory or file Stalwart would write through is a link or another user's."""

    def __init__(self, path: Path, why: str, *, foreign: bool) -> None:
        super().__init__(
            f"{path} {why}; it could have been planted by another user",
            f"remove {path} (or choose another directory) and start again",
        )
        self.path = path
        self.why = why
        self.foreign = foreign  # a link, not a directory, or another user's (not just a loose mode)


def open_dir(parent_fd: int, name: str, shown: Path, *, create: bool = True, tighten: bool = True) -> int:
    """A descriptor of directory ``name`` in ``parent_fd``, created 0700 when missing (``create``).
    Refused (:class:`PathRefused`) when it is a link, not a directory, not this user's, or writable
    by group or others (unless sticky and not ``tighten``); ``tighten``: other bits become 0700.
    Other failures (no space, no permission) are the ``OSError`` itself."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PathRefused(shown, "is a symbolic link or not a directory", foreign=True) from None
        raise
    try:
        _verify_dir(fd, shown, tighten)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _verify_dir(fd: int, shown: Path, tighten: bool) -> None:
    st = os.fstat(fd)
    uid, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    if st.st_uid != uid:
        raise PathRefused(shown, f"is owned by uid {st.st_uid}, not by this user (uid {uid})", foreign=True)
    if mode & 0o022 and (tighten or not mode & stat.S_ISVTX):
        raise PathRefused(shown, f"has mode {mode:04o}, not 0700 (others could write in it)", foreign=False)
    if tighten and mode & 0o077:
        os.fchmod(fd, 0o700)


def open_root(path: Path) -> int:
    """A descriptor of the directory the user named (``--log-dir``, ``--run-dir``): its missing
    parents are created 0700 as given; the directory itself is created 0700 when missing, opened
    without following a link (one this user made is resolved first; another user's is refused), and
    must be this user's and not writable by others (unless sticky); an existing one keeps its mode."""
    path = Path(os.path.abspath(path))
    _refuse_foreign_links(path)
    if os.path.islink(path) and os.lstat(path).st_uid == os.geteuid():
        path = Path(os.path.realpath(path))  # a link of this user's own making: where it points
    top = path
    while top.parent != top and not os.path.lexists(top.parent):
        top = top.parent
    fd = os.open(top.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return _descend(fd, top.parent, path.relative_to(top.parent).parts, tighten_last=False)


def _descend(fd: int, base: Path, names: Sequence[str], *, tighten_last: bool = True) -> int:
    """From the verified directory ``fd`` (``base``), each of ``names`` in turn as :func:`open_dir`;
    the deepest one's descriptor (``fd`` is closed on every path)."""
    try:
        for i, name in enumerate(names):
            last = i == len(names) - 1
            nfd = open_dir(fd, name, base.joinpath(*names[: i + 1]), tighten=tighten_last or not last)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_foreign_links(path: Path) -> None:
    """Refuse a link on the way to ``path`` that another user (not root) made: they chose where
    it points. Links of this user's or root's (``/home`` -> ``/data/home``) are the system's."""
    for p in (*reversed(path.parents), path):
        try:
            st = os.lstat(p)
        except OSError:
            return  # missing from here on: created below, each level verified
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            raise PathRefused(p, f"is a symbolic link of uid {st.st_uid}", foreign=True)


def open_dirs(root: Path, names: Sequence[str]) -> int:
    """A descriptor of ``root/names[0]/names[1]/...``: the root as :func:`open_root`, every level
    below created or opened as :func:`open_dir` (0700, this user's, never through a link)."""
    return _descend(open_root(root), root, names)


def open_file(dir_fd: int, name: str, shown: Path) -> int:
    """``name`` in the verified directory ``dir_fd``, opened to append: created 0600 (``O_EXCL``)
    when new; an existing one must be a regular file of this user's with one link (a wider mode is
    taken back to 0600). Never through a link."""
    try:
        return os.open(name, _FILE | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(shown, "is a symbolic link", foreign=True) from None
        raise
    st = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_nlink != 1:
        why = f"has {st.st_nlink} hard links"
    if why:
        os.close(fd)
        raise PathRefused(shown, why, foreign=True)
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o600)
    os.set_blocking(fd, True)
    return fd


def open_log(path: Path, root: Path | None = None) -> int:
    """Append to log file ``path``: ``root`` is the directory the user named (``path``'s parent
    when None) and the levels between it and the file are created or verified as :func:`open_dirs`
    does. Every failure is one :class:`ConfigError` (a refusal names what to remove)."""
    root = path.parent if root is None else root
    try:
        names = path.parent.relative_to(root).parts
        dir_fd = open_dirs(root, names)
    except ValueError:
        raise ConfigError(f"log file {path} is not under {root}") from None
    except OSError as exc:
        raise ConfigError(
            f"cannot create the log directory for {path}: {exc.strerror}", "choose a writable --log-dir"
        ) from None
    try:
        return open_file(dir_fd, path.name, path)
    except OSError as exc:
        raise ConfigError(
            f"cannot open log file {path}: {exc.strerror}", "choose a writable --log-dir"
        ) from None
    finally:
        os.close(dir_fd)
