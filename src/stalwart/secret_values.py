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

from .errors import ConfigError, StalwartError

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
    the file is missing, empty, too large, not a regular file, not this user's, or readable by group
    or others."""
    data = read_secret_bytes(path, what)
    return data.decode("utf-8", errors="replace").strip()


def read_secret_bytes(
    path: str | os.PathLike[str], what: str, error: type[StalwartError] = ConfigError
) -> bytes:
    """The bytes of secret file ``path`` (surrounding whitespace stripped), refused (``error``) as
    :func:`read_secret_file` says: a link is not followed, and the file must be a regular file owned
    by this user with no permission for group or others (``chmod 600``)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise error(
            f"cannot read the {what} file {p}: {exc.strerror}", f"give a readable {what} file"
        ) from None
    with open(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise error(f"the {what} file {p} is not a regular file", f"give a regular {what} file")
        if st.st_uid != os.geteuid():
            raise error(
                f"the {what} file {p} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})",
                f"give a {what} file of your own (copy it, then run `chmod 600` on the copy)",
            )
        if st.st_mode & 0o077:
            raise error(
                f"the {what} file {p} has mode {stat.S_IMODE(st.st_mode):04o}: others could read it",
                f"run `chmod 600 {p}`",
            )
        data = fh.read(MAX_SECRET_FILE + 1).strip()
    if not data or len(data) > MAX_SECRET_FILE:
        raise error(f"the {what} file {p} is empty or larger than {MAX_SECRET_FILE} bytes", f"check {p}")
    return data


def read_url_file(path: str | os.PathLike[str], what: str) -> list[str]:
    """One URL per line of a secret file (blank lines and ``#`` comments skipped)."""
    lines = read_secret_file(path, what).splitlines()
    return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]
