"""Node names: validated before they reach a scheduler command or become part of a path.

A node name is one host name: dot-separated labels of letters, digits, ``-`` and ``_`` (at most 63
characters each, 253 in all), starting with a letter, digit or ``_``. Anything else is refused:
Slurm hostlists (``gpu[001-512]``, ``n1,n2``) would act on many nodes at once, ``key=value`` or
spaces could smuggle arguments into ``scontrol``, and ``/`` or ``..`` would put files outside the
state and run directories.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from .errors import ConfigError

MAX_LENGTH = 253
MAX_LABEL = 63
MAX_REASON = 1024
_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"  # labels of at most MAX_LABEL characters
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:60] + "...")


def validate_node_name(value: object, what: str = "node name") -> str:
    """Return ``value`` if it is one valid host name, else raise :class:`ConfigError`."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be text, not {type(value).__name__}")
    if not value:
        raise ConfigError(f"{what} is empty", "pass one host name, e.g. gpu017")
    if len(value) > MAX_LENGTH:
        raise ConfigError(
            f"{what} is {len(value)} characters long (at most {MAX_LENGTH})", "pass one host name"
        )
    if not _NAME.fullmatch(value):
        raise ConfigError(
            f"{what} {_shown(value)} is not one host name",
            "use letters, digits, '-', '_' and '.' only (no hostlists like gpu[1-4] or a,b; no '/', '=', spaces)",
        )
    return value


def printable_name(text: str, *, limit: int = MAX_LENGTH) -> str:
    """``text`` (a node name read from another process or a store, so untrusted) made safe to print
    or record: every character that is not printable (control characters such as ESC, CR and
    newline, bidirectional overrides) and the backslash are written as Python escapes (``\\x1b``,
    ``\\n``, ``\\u202e``, ``\\\\``), and anything beyond ``limit`` characters is cut and counted
    (``...(+N characters)``). A valid host name comes back unchanged."""
    cut = text[:limit]
    shown = "".join(c if c.isprintable() and c != "\\" else _escape(c) for c in cut)
    if len(text) > limit:
        shown += f"...(+{len(text) - limit} characters)"
    return shown


def _escape(c: str) -> str:
    n = ord(c)
    if c == "\\":
        return "\\\\"
    if c in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c]
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _pydantic_node_name(value: str) -> str:
    try:
        return validate_node_name(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


NodeName = Annotated[str, AfterValidator(_pydantic_node_name)]
"""A pydantic field type for one validated node name."""


def validate_drain_reason(reason: object) -> str:
    """A drain reason is one printable line of at most :data:`MAX_REASON` characters."""
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigError("a drain reason must be non-empty text", "Slurm needs a reason to drain a node")
    if len(reason) > MAX_REASON:
        raise ConfigError(f"drain reason is {len(reason)} characters long (at most {MAX_REASON})")
    if not reason.isprintable():
        raise ConfigError(f"drain reason {_shown(reason)} has control characters", "use one printable line")
    return reason
