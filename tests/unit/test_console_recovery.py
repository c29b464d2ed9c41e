"""The live console names each recovery's path and its phases, from the events it is shown."""

from __future__ import annotations

import dataclasses
import io

from stalwart.events import DecisionTaken, FailureDetected, TrainingResumed
from stalwart.launch.console import RunConsole
from widths import unwrap  # tests/ is on sys.path (its conftest)


def _show(events) -> str:
    out = io.StringIO()
    con = RunConsole(stream=out)
    for ev in events:
        if isinstance(ev, tuple):  # a step of rank 0 (the node's one rank) and progress: (now, step, attempt)
            con.stepped(ev[2], [(0, ev[0] - 0.1, ev[0])], 1)
            con.progress(ev[1], 40, ev[2], 1.0, now=ev[0])
        else:
            con.event(ev)
    return unwrap(out.getvalue())  # a line as printed, before the terminal's width broke it


def test_path_and_phases_are_printed_once_per_recovery():
    text = _show(
        [
            DecisionTaken(ts=1.0, action="start_warm", reason="warm: forked from the fork server", attempt=0),
            TrainingResumed(ts=2.0, step=0, rank=0, attempt=0),
            (2.5, 1, 0),  # a first start is no recovery
            FailureDetected(ts=10.5, failure="crash", evidence="x", onset=10.0, rank=1, attempt=0),
            DecisionTaken(ts=10.75, action="restart", reason="restart: crash", attempt=0),
            DecisionTaken(ts=11.0, action="start_cold", reason="cold: warm start failed (gone)", attempt=1),
            TrainingResumed(ts=13.0, step=5, rank=0, attempt=1),
            (13.5, 6, 1),
            (14.0, 7, 1),
        ]
    )
    assert "workers started warm: forked from the fork server" in text
    assert "workers started cold: warm start failed (gone)" in text
    lines = [ln for ln in text.splitlines() if "recovered on the" in ln]
    assert len(lines) == 1, text
    assert (
        "cold path 3.50s after the fault: detect 0.50s, stop and decide 0.25s, re-form 0.25s, "
        "start to first step 2.50s" in lines[0]
    )


def test_a_recovery_is_told_once_every_rank_of_the_node_stepped_again():
    out = io.StringIO()
    con = RunConsole(stream=out)
    con.event(FailureDetected(ts=10.5, failure="crash", evidence="x", onset=10.0, rank=1, attempt=0))
    con.event(DecisionTaken(ts=10.75, action="restart", reason="restart: crash", attempt=0))
    con.event(DecisionTaken(ts=11.0, action="start_warm", reason="warm: forked", attempt=1))
    con.stepped(1, [(0, 12.0, 12.5)], 2)
    assert "recovered on the" not in out.getvalue()  # rank 1 has not stepped yet
    con.stepped(1, [(0, 12.5, 13.0), (1, 12.2, 13.25)], 2)
    (said,) = [ln for ln in unwrap(out.getvalue()).splitlines() if "recovered on the" in ln]
    assert "warm path 3.25s after the fault" in said and "start to first step 2.25s" in said, said


def test_why_in_place_was_not_taken_is_said_once_per_job_however_many_failures():
    why = "the ranks run session.loop outside Session.run, so ...; to recover in place, run ... Session.run"
    skip = [DecisionTaken(ts=10.0 + i, action="in_place_skipped", reason=why, attempt=i) for i in range(3)]
    text = _show(skip)
    lines = [ln for ln in text.splitlines() if "in place not taken" in ln]
    assert len(lines) == 1 and "Session.run" in lines[0], text
    other = DecisionTaken(ts=20.0, action="in_place_skipped", reason="a stop was requested", attempt=3)
    assert "in place not taken: a stop was requested" in _show([*skip, other])  # another reason is news


def test_progress_without_a_known_total_shows_steps_rate_and_elapsed_never_a_question_mark():
    out = io.StringIO()
    con = RunConsole(stream=out)
    for i, step in enumerate((1, 2, 3, 4, 5, 9, 10, 11)):
        con.progress(step, 0, 0, 0.0 if step == 1 else 20.0, now=100.0 + i)
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0].strip() for ln in lines] == ["step 1", "step 2", "step 5", "step 10"]
    assert "rate -" in lines[0] and "20.0 steps/s" in lines[1] and "0m04s elapsed" in lines[2]
    assert not any("?" in ln or "%" in ln for ln in lines)
    con.progress(12, 0, 0, 20.0, now=140.0)  # half a minute on, still advancing: a line anyway
    assert out.getvalue().splitlines()[-1].strip().startswith("step 12")


def test_progress_with_a_total_prints_each_tenth_with_its_percent():
    out = io.StringIO()
    con = RunConsole(stream=out)
    for step in range(1, 41):
        con.progress(step, 40, 1, 10.0, now=float(step))
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and lines[-1].strip().startswith("step 40/40 (100%), attempt 1")


def test_a_stopped_ranks_stack_line_says_it_was_stopped_and_names_py_spys_frame():
    from stalwart.events import StackCaptured

    stack = '(stopped, state T: read from outside by py-spy dump --nonblocking)\nThread 9 (idle): "MainThread"\n    step (t.py:3)\n'
    text = _show([StackCaptured(ts=1.0, rank=1, reason="hung rank", stack=stack, attempt=0)])
    assert "rank 1 (the rank is stopped: state T)" in text and "innermost: step (t.py:3) (py-spy)" in text


def test_an_injected_hang_is_labelled_with_its_plan_entry_and_a_real_one_is_not():
    hung = FailureDetected(ts=20.0, failure="hang", evidence="silent 10s", onset=10.0, rank=1, attempt=0)
    text = _show([hung, dataclasses.replace(hung, injected="hang@rank=1,step=5")])
    first, second = [ln for ln in text.splitlines() if "hang detected" in ln]
    assert "chaos plan" not in first
    assert "(injected by the chaos plan: hang@rank=1,step=5)" in second
