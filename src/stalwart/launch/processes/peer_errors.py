"""Keep the survivors' communication tracebacks off the console (they stay in the rank logs).

When one rank dies, every other rank's next collective fails with a gloo/NCCL error ("Connection
closed by peer", a watchdog timeout): a screenful of tracebacks that says nothing about the cause and
arrives before the agent's verdict, which names it. :class:`PeerErrorFilter` sits between a worker's
stream and the console: it holds a Python traceback until its exception line, then drops it from the
console when the exception is a communication error and passes it on otherwise (a user's own
exception is shown whole). Everything still goes to the rank's log. Pure; one per stream.
"""

from __future__ import annotations

import re

from ...protocol.error_record import COMM_TEXT, COMM_TYPES

__all__ = ["MAX_HELD_LINES", "PeerErrorFilter"]

MAX_HELD_LINES = 400  # a traceback longer than this is shown as it is
_PREFIX = re.compile(rb"^\[[\w.-]+\]:\s?")  # torch's "[rank1]: " line prefix
_HEADER = b"Traceback (most recent call last):"
_CHAIN = (b"The above exception was the direct cause", b"During handling of the above exception")
_EXC_TYPE = re.compile(r"^([\w.]+)(?::|$)")


def _is_comm(exception_line: str) -> bool:
    m = _EXC_TYPE.match(exception_line)
    return bool((m and COMM_TYPES.search(m.group(1))) or COMM_TEXT.search(exception_line[:500]))


class PeerErrorFilter:
    """``feed(line)`` -> the lines to show now; ``flush()`` at the end of the stream."""

    def __init__(self) -> None:
        self._held: list[bytes] = []
        self._dropping = False  # the last block was a comm error: its chain's glue lines go too

    def feed(self, line: bytes) -> list[bytes]:
        body = _PREFIX.sub(b"", line, count=1)
        if not self._held:
            if body.startswith(_HEADER):
                self._held.append(line)
                return []
            if self._dropping and (not body.strip() or body.startswith(_CHAIN)):
                return []
            self._dropping = False
            return [line]
        self._held.append(line)
        text = body.rstrip(b"\r\n")
        if not text.strip() or text[:1] in (b" ", b"\t") or text.startswith((_HEADER, *_CHAIN)):
            if len(self._held) >= MAX_HELD_LINES:
                return self.flush()
            return []  # a frame, a blank line or a chained traceback: keep holding
        held, self._held = self._held, []
        self._dropping = _is_comm(text.decode(errors="replace"))
        return [] if self._dropping else held

    def flush(self) -> list[bytes]:
        held, self._held = self._held, []
        return held
