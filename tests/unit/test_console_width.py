"""The live console of ``stalwart run`` fits its terminal: every line wrapped to 80 columns when
piped (the terminal's width on one), under the text after its clock time; and the tests' unwrap
(tests/widths.py) gives back each line as one, so a match on the console's words survives a wrap."""

from __future__ import annotations

import io
import re

import pytest

from stalwart.events import DecisionTaken, FailureDetected, JobEnded, JobStarted, TrainingResumed
from stalwart.launch.console import RunConsole, _bar_line
from widths import unwrap

LOG = "/tmp/pytest-of-someone/pytest-1234/test_a_rather_long_test_name0/run/logs/host-a0-r1.log"
EVENTS = [
    JobStarted(
        ts=1.0, script="train.py", args=("--steps", "200", "--lr", "3e-4", "--out", LOG), nproc_per_node=4
    ),
    DecisionTaken(ts=2.0, action="start_warm", reason="warm: forked from the fork server (torch preloaded)"),
    TrainingResumed(ts=3.0, step=0, rank=0),
    (3.5, 1),
    FailureDetected(
        ts=10.5,
        failure="crash",
        evidence="killed by the chaos plan (crash at rank 1, step 40, SIGKILL): an injected fault, not a real one",
        onset=10.0,
        step=40,
        rank=1,
        injected="crash@rank=1,step=40",
    ),
    DecisionTaken(
        ts=10.7, action="restart", reason="restart: crash of rank 1 at step 40 (SIGKILL); 1 of 3 used"
    ),
    DecisionTaken(ts=11.0, action="start_cold", reason="cold: the fork server is gone (forced by chaos)"),
    (13.5, 41),
    JobEnded(
        ts=20.0,
        verdict="training finished after 2 attempts, 1 failure recovered",
        outcome="succeeded",
        exit_code=0,
        requeue_helps=False,
    ),  # fmt: skip
]


def _console(monkeypatch, columns: int) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()
    con = RunConsole(stream=out)
    for ev in EVENTS:
        if isinstance(ev, tuple):  # the node's one rank stepped, and progress: (now, step)
            con.stepped(int(ev[0] > 10), [(0, ev[0] - 0.1, ev[0])], 1)  # attempt 1 after the restart
            con.progress(ev[1], 200, 0, 1.0, now=ev[0])
        else:
            con.event(ev)
    con.say(
        f"00:00:21 last lines of rank 1 (its log: {LOG}):\nTraceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n    main()\nRuntimeError: boom'
    )  # a note, at a fixed time; fmt: skip
    return out.getvalue()


def test_every_line_of_the_console_fits_80_columns_and_goes_on_under_its_text(monkeypatch):
    text = _console(monkeypatch, 80)
    rows = text.splitlines()
    assert all(len(row) <= 80 for row in rows), [row for row in rows if len(row) > 80]
    detected = next(i for i, row in enumerate(rows) if "crash detected" in row)
    assert rows[detected + 1].startswith(" " * 9) and rows[detected + 1][9] != " "  # under "crash"
    assert any(len(row) == 80 for row in rows), "the log's path is longer than a line: cut inside it"
    assert '  File "train.py", line 3, in <module>\n    main()\nRuntimeError: boom' in text
    assert not [row for row in rows if row.endswith(" ")], "a row ends at a word, never in spaces"
    started = next(line for line in unwrap(text).splitlines() if "job started" in line)
    assert started.endswith(
        f"train.py --steps 200 --lr 3e-4 --out {LOG} (4 proc/node, nodes 1:1, max restarts 0)"
    )


@pytest.mark.parametrize("columns", [80, 60, 100])
def test_unwrap_gives_back_each_line_as_printed_on_a_wide_terminal(monkeypatch, columns):
    wide = _console(monkeypatch, 10_000)
    narrow = _console(monkeypatch, columns)
    assert narrow != wide
    # a break swallows a run of spaces, as a terminal shows it: compare with runs of spaces as one
    assert re.sub(" +", " ", unwrap(narrow, columns)) == re.sub(" +", " ", wide)
    assert re.search(r"recovered on the \w+ path [0-9.]+s after the fault", unwrap(narrow, columns))


def test_the_progress_bar_on_a_terminal_fits_its_width():
    line = "step 120/200 (60%), attempt 3, 12.5 steps/s, 1h02m elapsed"
    assert _bar_line(line, 120, 200, 200).startswith("  [" + "#" * 18 + "-" * 12 + "] step")
    for width in (100, 80, 60, 40):
        shown = _bar_line(line, 120, 200, width)
        assert len(shown) < width and "step 120/200" in shown, (width, shown)
    assert _bar_line(line, 120, 0, 80) == f"  {line}"  # no total: no bar
