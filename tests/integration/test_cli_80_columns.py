"""What the CLI prints fits an 80-column terminal: every command's ``--help`` and the report of a
small synthetic ledger, run as a user runs them (a subprocess, stdout piped, ``COLUMNS=80``), have
no line over 80 columns and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from stalwart.cli import app
from stalwart.events import (
    AttemptStarted,
    DecisionTaken,
    FailureDetected,
    IncidentRaised,
    JobEnded,
    JobStarted,
    StepCompleted,
)
from stalwart.ledger import LedgerWriter
from widths import problems

RUN = "r80"
T0 = 1_795_869_900.0  # a wall-clock time, as in a real ledger


def test_the_check_catches_an_over_long_line_and_a_traceback():
    assert problems("short\n" + "x" * 81) == [f"81 columns: {'x' * 81}"]
    assert problems("x" * 80) == []
    assert problems("Traceback (most recent call last):\n  File ...") == ["a traceback"]


def _cli(*args: str, columns: str | None = "80") -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [sys.executable, "-m", "stalwart.cli", *args],
        capture_output=True,  # stdout and stderr are pipes, as in `stalwart report ... | less`
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def _paths(cmd, prefix=()):
    yield prefix
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _paths(sub, (*prefix, name))


COMMANDS = list(_paths(typer.main.get_command(app)))


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "stalwart")
def test_help_fits_80_columns_when_piped(path):
    text = _cli(*path, "--help")
    assert text.startswith("Usage: stalwart")
    assert not problems(text)


def _ledger(run_dir: Path, *, failed: bool) -> None:
    ctx = {"run_id": RUN, "node": "node-with-a-rather-long-name-0"}
    ev: list = [
        JobStarted(ts=T0, attempt=0, script="train.py", **ctx),
        AttemptStarted(ts=T0 + 0.5, attempt=0, world_size=2, **ctx),
    ]
    ev += [
        StepCompleted(ts=T0 + 2 + i, attempt=0, rank=0, step=i, start=T0 + 1 + i, duration=1.0, **ctx)
        for i in range(5)
    ]
    if failed:
        cause = (
            "a cause long enough to wrap: rank 1 stopped answering while its peers waited in an "
            "all-reduce; the hang timeout 10.000s = floor (3 x p99 step time 1.000s is below it) "
            "passed with no step and no CPU progress on rank 1"
        )
        ev += [
            FailureDetected(
                ts=T0 + 8.2,
                attempt=0,
                rank=1,
                failure="hang",
                evidence="no step",
                onset=T0 + 7,
                step=5,
                **ctx,
            ),
            IncidentRaised(
                ts=T0 + 8.3,
                onset=T0 + 7,
                attempt=0,
                cause=cause,
                fault_class="user_program",
                component="unknown",
                confidence=0.6,
                action="restart",
                rule="hang",
                evidence=(f"node-with-a-rather-long-name-0 rank 1 at 10:45:07: {cause}", "/" + "d" * 100),
                nodes=("node-with-a-rather-long-name-0",),
                ranks=(1,),
                **ctx,
            ),
            DecisionTaken(ts=T0 + 8.4, attempt=0, action="restart", reason="restart", **ctx),
            AttemptStarted(ts=T0 + 9, attempt=1, world_size=2, **ctx),
        ]
        ev += [
            StepCompleted(
                ts=T0 + 11 + i, attempt=1, rank=0, step=5 + i, start=T0 + 10 + i, duration=1.0, **ctx
            )
            for i in range(5)
        ]
    last = ev[-1].ts
    ev.append(
        JobEnded(
            ts=last + 1,
            attempt=ev[-1].attempt,
            verdict="done",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
            **ctx,
        )
    )
    with LedgerWriter(run_dir / "ledger" / "agent.ledger", writer="test") as w:
        for e in ev:
            w.append(e)


@pytest.mark.parametrize("columns", ["80", None], ids=["COLUMNS=80", "no COLUMNS"])
def test_report_fits_80_columns_when_piped(tmp_path, columns):
    _ledger(tmp_path, failed=True)
    text = _cli("report", str(tmp_path), columns=columns)
    assert not problems(text), problems(text)
    flat = " ".join(text.split())
    assert "failures 1; MTBF" in flat and "MTTR" in flat
    assert "hang timeout 10.000s = floor" in flat  # the cause is wrapped, not cut
    assert "t=1795" not in flat


def test_a_clean_run_says_no_failures_and_no_mttr(tmp_path):
    _ledger(tmp_path, failed=False)
    text = _cli("report", str(tmp_path))
    assert not problems(text), problems(text)
    assert "failures: none" in text and "MTTR" not in text and "MTBF" not in text
    assert "5 steps" in text
