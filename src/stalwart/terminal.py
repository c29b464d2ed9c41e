"""Text for a terminal of 80 columns: how wide output is when piped, prose wrapped with a hanging
indent (under the text after a leading clock time), text cut at a word with an ellipsis, counts with
their plural, local clock times.

Rich measures a terminal itself; when stdout is not one (a pipe, a file, a CI log) it would measure
stdin's or stderr's terminal instead, so piped output came out 139 columns wide on a wide
terminal. :func:`output_width` gives such output ``COLUMNS`` columns, else 80."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

PIPED_WIDTH = 80


def output_width(stream: IO[str] | None = None) -> int | None:
    """Columns for output to ``stream`` (stdout): None on a terminal (rich measures it), else
    ``COLUMNS`` when set, else 80."""
    out = stream if stream is not None else sys.stdout
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        return None
    cols = os.environ.get("COLUMNS", "")
    return int(cols) if cols.isdigit() and int(cols) > 0 else PIPED_WIDTH


def console(stream: IO[str] | None = None) -> Console:
    """A rich console for a command's output, as wide as :func:`output_width` says."""
    from rich.console import Console  # deferred: heavy (rich)

    return Console(file=stream, width=output_width(stream), highlight=False)


def _spans(plain: str, width: int, hang: int) -> list[tuple[int, int]]:
    """Where a line of ``plain`` breaks: at the last space before the line is full (the first line
    ``width`` columns, the next ones ``width - hang``); a word longer than a whole line is cut, so a
    line filled to its last column is one cut inside a word (what an unwrap needs to join it)."""
    spans, start, room = [], 0, width
    while len(plain) - start > room:
        cut = plain.rfind(" ", start, start + room)
        if cut <= start or not plain[start:cut].strip():
            cut = start + room  # one word fills the line: cut it (a path, a hash)
            spans.append((start, cut))
            start = cut
        else:
            spans.append((start, cut))
            start = cut + 1
        while start < len(plain) and plain[start] == " ":
            start += 1
        room = max(width - hang, 10)
    spans.append((start, len(plain)))
    return spans


CLOCK_HANG = 9  # "HH:MM:SS ": a line that starts with a clock time goes on under the text after it
_CLOCK = re.compile(r"\d\d:\d\d:\d\d ")


def say(con: Console, text: str, *, hang: int | None = 2, markup: bool = True) -> None:
    """Print prose wrapped at words to the console's width, each line after a paragraph's first
    indented ``hang`` columns deeper than its first (rich markup unless ``markup`` is False); with
    ``hang`` None, a paragraph that starts with a clock time goes on under the text after it
    (:data:`CLOCK_HANG` columns), any other 2 columns deeper. All of it in one write, so the
    workers' output to the same terminal falls between lines of ours, not inside one."""
    from rich.text import Text  # deferred: heavy (rich)

    lines: list[Text] = []
    for t in (Text.from_markup(text) if markup else Text(text)).split("\n", allow_blank=True):
        plain = t.plain
        lead = len(plain) - len(plain.lstrip(" "))
        deeper = hang if hang is not None else CLOCK_HANG if _CLOCK.match(plain) else 2
        pad = " " * (lead + deeper)
        for i, (a, b) in enumerate(_spans(plain, con.width, lead + deeper)):
            lines.append(t[a:b] if i == 0 else Text(pad) + t[a:b])
    con.print(Text("\n").join(lines), soft_wrap=True, highlight=False)


def shorten(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut after a whole word with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    head = text[:cut] if cut > limit // 2 else text[: limit - 1]
    return head.rstrip(" ,;:(") + "…"


def plural(n: int, word: str, many: str = "") -> str:
    """``1 job``, ``2 jobs``; ``many`` for a plural that is not ``word + "s"``."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def clock(ts: float) -> str:
    """A wall-clock timestamp as the local time of day, ``HH:MM:SS``."""
    return time.strftime("%H:%M:%S", time.localtime(ts))
