"""Text for an 80-column terminal (stalwart/terminal.py): the width of piped output, prose wrapped with
a hanging indent, text cut at a word, plurals, clock times in evidence."""

from __future__ import annotations

import io
import time

from rich.console import Console

from stalwart.diagnose.signals import Signal
from stalwart.terminal import clock, output_width, plural, say, shorten


def test_piped_output_is_80_columns_unless_columns_says(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output_width(io.StringIO()) == 80
    monkeypatch.setenv("COLUMNS", "100")
    assert output_width(io.StringIO()) == 100
    monkeypatch.setenv("COLUMNS", "wide")
    assert output_width(io.StringIO()) == 80


def _said(text: str, width: int = 40, **kw) -> list[str]:
    out = io.StringIO()
    say(Console(file=out, width=width, highlight=False), text, **kw)
    return out.getvalue().splitlines()


def test_prose_wraps_at_words_with_a_hanging_indent():
    lines = _said("  one two three four five six seven eight nine ten eleven twelve thirteen")
    assert lines == [
        "  one two three four five six seven",
        "    eight nine ten eleven twelve",
        "    thirteen",
    ]
    assert all(len(ln) <= 40 for ln in lines)


def test_markup_is_styled_not_printed_and_a_word_too_long_is_cut():
    assert _said("[bold]short[/] line") == ["short line"]
    lines = _said("x " + "y" * 50, width=20)
    assert lines[0] == "x" and all(len(ln) <= 20 for ln in lines)
    assert "".join(ln.strip() for ln in lines[1:]) == "y" * 50


def test_text_is_cut_after_a_whole_word_with_an_ellipsis():
    text = "no node-level cause in the window (first: hang timeout 10.000s = floor over 5 steps)"
    assert shorten(text, 200) == text
    cut = shorten(text, 70)
    assert cut == "no node-level cause in the window (first: hang timeout 10.000s =…"
    assert len(cut) <= 70 and not cut.endswith("f…")


def test_counts_take_their_plural():
    assert plural(1, "job") == "1 job" and plural(2, "job") == "2 jobs" and plural(0, "step") == "0 steps"
    assert plural(1, "surviving rank") == "1 surviving rank"
    assert plural(3, "process", "processes") == "3 processes"


def test_evidence_shows_the_local_clock_not_epoch_seconds():
    ts = 1_795_869_939.0
    line = Signal(ts=ts, node="n0", rank=1, code="process.hang", text="silent").line()
    assert line == f"n0 rank 1 at {time.strftime('%H:%M:%S', time.localtime(ts))}: silent"
    assert clock(ts) in line and "1795869939" not in line
