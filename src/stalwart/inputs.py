"""Bounded readers for everything a user hands Stalwart: files, JSON/YAML, run directories.

Every reader refuses what would hang or exhaust the process (a FIFO, a device, a directory, a file
larger than its limit, nesting deeper than a parser can take, an alias bomb) with one
:class:`~stalwart.errors.ConfigError` line. Callers pass ``error`` to raise their own type
(``FaultPlanError``, ``TelemetryError``) instead.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from .errors import ConfigError, StalwartError

MiB = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 200_000  # containers + scalars walked in one parsed document
_FORBIDDEN_RUN_DIR_ROOTS = ("/proc", "/sys", "/dev")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a file"
    return "not a regular file"


def _open_regular(path: Path, what: str, error: type[StalwartError]) -> tuple[int, os.stat_result]:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below refuses it anyway
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist", "check the path") from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{what} {path} is {_kind(st.st_mode)}", "pass a regular file")
    return fd, st


def _read_fd(fd: int, offset: int, n: int) -> bytes:
    chunks = []
    while n > 0:
        b = os.pread(fd, min(n, MiB), offset)
        if not b:
            break
        chunks.append(b)
        offset += len(b)
        n -= len(b)
    return b"".join(chunks)


def _text(data: bytes, path: Path, what: str, error: type[StalwartError], replace: bool) -> str:
    if b"\x00" in data and not replace:
        raise error(f"{what} {path} is binary, not text", "pass a text file")
    try:
        return data.decode("utf-8", errors="replace" if replace else "strict")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text", "pass a text file") from None


def read_text_file(
    path: str | os.PathLike[str],
    max_bytes: int,
    what: str,
    *,
    error: type[StalwartError] = ConfigError,
    replace_errors: bool = False,
) -> str:
    """The whole text of a regular file of at most ``max_bytes``; anything else is one clear error.

    ``replace_errors``: bytes that are not UTF-8 (NUL included) become U+FFFD / stay, for telemetry
    whose parser reports them itself; otherwise binary or non-UTF-8 content is an error.
    """
    p = Path(path)
    fd, st = _open_regular(p, what, error)
    try:
        if st.st_size > max_bytes:
            raise error(f"{what} {p} is {st.st_size:,} bytes (at most {max_bytes:,})", "pass a smaller file")
        data = _read_fd(fd, 0, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while we read
        raise error(f"{what} {p} is over {max_bytes:,} bytes", "pass a smaller file")
    return _text(data, p, what, error, replace_errors)


def read_text_tail(
    path: str | os.PathLike[str], max_bytes: int, what: str, *, error: type[StalwartError] = ConfigError
) -> tuple[str, bool]:
    """The last ``max_bytes`` of a regular file (from a line start) and whether it was cut."""
    p = Path(path)
    fd, st = _open_regular(p, what, error)
    try:
        start = max(0, st.st_size - max_bytes)
        data = _read_fd(fd, start, max_bytes)
    finally:
        os.close(fd)
    cut = start > 0
    if cut:
        nl = data.find(b"\n")
        data = data[nl + 1 :] if nl >= 0 else b""
    return data.replace(b"\x00", b"").decode("utf-8", errors="replace"), cut


def check_shape(
    data: Any,  # Any: json.loads/yaml.safe_load return untyped data; callers validate it
    what: str,
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    error: type[StalwartError] = ConfigError,
) -> Any:  # Any: the document as given, of any shape
    """Refuse documents nested deeper than ``max_depth`` or with more than ``max_nodes`` values.

    Iterative, and it counts every visit, so YAML aliases that fan out (a "billion laughs") stop at
    the node budget instead of being walked in full.
    """
    stack: list[tuple[Any, int]] = [(data, 1)]  # Any: parsed JSON/YAML of any shape
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > max_nodes:
            raise error(f"{what} has more than {max_nodes:,} values", "pass a smaller document")
        if isinstance(item, (dict, list, tuple)):
            if depth > max_depth:
                raise error(f"{what} is nested deeper than {max_depth} levels", "flatten it")
            children = list(item.keys()) + list(item.values()) if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children)
    return data


# Any: json.loads returns untyped data; callers validate it
def parse_json(text: str, what: str, *, error: type[StalwartError] = ConfigError, **limits: int) -> Any:
    try:
        data = json.loads(text)
    except RecursionError:
        raise error(f"{what} is nested too deeply", "flatten it") from None
    except ValueError as exc:
        raise error(f"{what} is not valid JSON: {str(exc)[:200]}") from None
    return check_shape(data, what, error=error, **limits)


# Any: yaml.safe_load returns untyped data; callers validate it
def parse_yaml(text: str, what: str, *, error: type[StalwartError] = ConfigError, **limits: int) -> Any:
    import yaml  # deferred: heavy (yaml)

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except RecursionError:
        raise error(f"{what} is nested too deeply", "flatten it") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise error(f"{what} is not valid YAML: {first[:200]}") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp libyaml cannot build
        raise error(f"{what} has a value YAML cannot represent: {str(exc)[:200]}") from None
    return check_shape(data, what, error=error, **limits)


def validate_run_dir(path: str | os.PathLike[str]) -> Path:
    """A run directory must be a directory (or not exist yet), not ``/`` and not under /proc, /sys, /dev."""
    p = Path(path)
    text = str(path)
    if not text.strip():
        raise ConfigError("--run-dir is empty", "pass a directory, e.g. stalwart-runs/my-run")
    if len(text) > 4096 or "\x00" in text:
        raise ConfigError("--run-dir is not a usable path", "pass a directory, e.g. stalwart-runs/my-run")
    resolved = Path(os.path.realpath(p))
    if resolved == Path(resolved.anchor):
        raise ConfigError(f"--run-dir {text!r} is the file-system root", "pass a directory of its own")
    for root in _FORBIDDEN_RUN_DIR_ROOTS:
        if resolved == Path(root) or Path(root) in resolved.parents:
            raise ConfigError(
                f"--run-dir {text!r} is under {root}, which holds no real files", "pass a directory on a disk"
            )
    try:
        st = resolved.stat()
    except FileNotFoundError:
        return p
    except OSError as exc:
        raise ConfigError(f"--run-dir {text!r} cannot be used: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"--run-dir {text!r} is {_kind(st.st_mode)}, not a directory", "pass a directory")
    return p
