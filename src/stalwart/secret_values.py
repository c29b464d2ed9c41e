"""Secrets given to Stalwart (webhook URLs, tokens): read from a private file, shown redacted.

A Slack webhook URL is a credential: its path is the token. Everything that records or shows one (the
ledger's saved configuration, ``/healthz``, logs, metrics, error messages) shows :func:`redact_url`'s
``scheme://host/...`` instead. Every secret flag has a file form read by :func:`read_secret_file`,
which refuses a file that others could read (so the secret stays off command lines and out of
``ps``), besides its environment form.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from .errors import ConfigError

MAX_SECRET_FILE = 64 * 1024
_PREFIXES = ("generic:",)


def redact_url(url: str) -> str:
    """``https://hooks.slack.com/...`` for ``https://hooks.slack.com/services/T0/B0/xyz`` (a
    ``generic:`` prefix is kept; user, password, path, query and fragment are dropped)."""
    prefix = next((p for p in _PREFIXES if url.startswith(p)), "")
    try:
        parts = urlsplit(url[len(prefix) :])
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return f"{prefix}<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    return f"{prefix}{parts.scheme or '?'}://{host}{port}/..."


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every URL of ``secrets`` (and its bare form) replaced by its redacted form."""
    for s in secrets:
        bare = next((s[len(p) :] for p in _PREFIXES if s.startswith(p)), s)
        if bare:
            text = text.replace(bare, redact_url(bare))
    return text


def read_secret_file(path: str | os.PathLike[str], what: str) -> str:
    """The secret in ``path`` (surrounding whitespace stripped), refused with one clear error when
    the file is missing, empty, too large, not a regular file, or readable by group or others."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the {what} file {p}: {exc.strerror}", f"give a readable {what} file"
        ) from None
    with open(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"the {what} file {p} is not a regular file", f"give a regular {what} file")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"the {what} file {p} has mode {stat.S_IMODE(st.st_mode):04o}: others could read it",
                f"run `chmod 600 {p}`",
            )
        data = fh.read(MAX_SECRET_FILE + 1)
    text = data.decode("utf-8", errors="replace").strip()
    if not text or len(data) > MAX_SECRET_FILE:
        raise ConfigError(f"the {what} file {p} is empty or larger than {MAX_SECRET_FILE} bytes")
    return text


def read_url_file(path: str | os.PathLike[str], what: str) -> list[str]:
    """One URL per line of a secret file (blank lines and ``#`` comments skipped)."""
    lines = read_secret_file(path, what).splitlines()
    return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]
