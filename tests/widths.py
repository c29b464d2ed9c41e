"""What an 80-column terminal can show: the check every walk of the CLI's output uses.

Importable from every test package (``from widths import problems``), as ``netutil``."""

from __future__ import annotations

WIDTH = 80


def problems(text: str, width: int = WIDTH) -> list[str]:
    """The lines of ``text`` over ``width`` columns, and any traceback in it."""
    out = [f"{len(ln)} columns: {ln}" for ln in text.splitlines() if len(ln) > width]
    if "Traceback (most recent call last)" in text:
        out.append("a traceback")
    return out
