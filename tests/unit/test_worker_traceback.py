"""A failed worker's traceback is printed once: by the worker, where its stderr reaches the console
(the console then says where its log is), or else by the console from the worker's log."""

from __future__ import annotations

from pathlib import Path

from stalwart.launch.processes.worker_group import OutputRoute, WorkerSpec, ending_note

TRACEBACK = (
    "Traceback (most recent call last):\n  File \"/j/train.py\", line 3, in <module>\nKeyError: 'lr'\n"
)


def _spec(log: Path, route: OutputRoute | None) -> WorkerSpec:
    return WorkerSpec(local_rank=1, global_rank=5, env={}, log_path=log, route=route)


def test_a_traceback_the_worker_printed_on_the_console_is_pointed_to_not_printed_again(tmp_path):
    log = tmp_path / "n0-a0-r5.log"
    log.write_text("epoch 1\n" + TRACEBACK)
    for route in (None, OutputRoute(log), OutputRoute(log, console=(False, True))):  # stderr shown
        note = ending_note(_spec(log, route))
        assert note == f"rank 5's own output above shows how it ended (its log: {log})", route
        assert "KeyError" not in note


def test_a_traceback_kept_off_the_console_is_shown_from_the_log(tmp_path):
    log = tmp_path / "n0-a0-r5.log"
    log.write_text("epoch 1\n" + TRACEBACK)
    for console in ((True, False), (False, False)):  # stderr redirected, or the rank filtered out
        note = ending_note(_spec(log, OutputRoute(log, console=console)))
        assert note == f"last lines of rank 5 (its log: {log}):\n{TRACEBACK.rstrip()}", console


def test_no_log_no_note(tmp_path):
    assert ending_note(None) == ""
    assert ending_note(_spec(tmp_path / "absent.log", None)) == ""
