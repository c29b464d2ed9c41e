"""What an 80-column terminal can show: the check every walk of the CLI's output uses, and the
console's wrapped lines joined back for the tests that match them.

Importable from every test package (``from widths import problems``), as ``netutil``."""

from __future__ import annotations

import io
import re

from stalwart.terminal import CLOCK_HANG, output_width

WIDTH = 80


def problems(text: str, width: int = WIDTH) -> list[str]:
    """The lines of ``text`` over ``width`` columns, and any traceback in it."""
    out = [f"{len(ln)} columns: {ln}" for ln in text.splitlines() if len(ln) > width]
    if "Traceback (most recent call last)" in text:
        out.append("a traceback")
    return out


_CLOCK = re.compile(r"\d\d:\d\d:\d\d ")


def unwrap(text: str, width: int | None = None) -> str:
    """The console's text with each wrapped line joined back into one, for tests that match a
    line's words wherever the terminal's width broke it (stalwart.terminal.say with ``hang=None``).

    A row continues the line above when it is indented as that line's continuations are (under
    the text after a leading clock time, else 2 columns deeper than the line) and its first word
    would not have fit on the row above; a row filled to the last column was cut inside a word,
    so the next one joins it without a space. ``width``: the console's, by default as piped output
    has it (``COLUMNS``, else 80)."""
    width = width or output_width(io.StringIO()) or WIDTH
    lines: list[str] = []
    above, indent = "", -1
    for row in text.split("\n"):
        body = row.lstrip(" ")
        word = body.split(" ", 1)[0]
        if lines and body and len(row) - len(body) == indent and len(above) + 1 + len(word) >= width:
            lines[-1] += ("" if len(above) >= width else " ") + body
        else:
            lines.append(row)
            indent = CLOCK_HANG if _CLOCK.match(row) else len(row) - len(body) + 2
        above = row
    return "\n".join(lines)
