"""The agent's request for its ranks' stacks (launch/failure_files.py ``capture_stacks``): it waits
for every answer a short while, and longer, up to the stop grace, while too few ranks have answered
to pin a hang on a loaded machine. Answers arrive on a manual clock: no real second passes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from stalwart.launch.clock import ManualClock
from stalwart.launch.failure_files import AttemptFiles
from stalwart.protocol.run_dir import RunDir

GRACE = 3.0


class Answering(ManualClock):
    """Writes rank r's stack into its file once the clock passes ``at[r]``."""

    def __init__(self, run: RunDir, at: dict[int, float]) -> None:
        super().__init__(0.0)
        self.run, self.at = run, at
        self.written: set[int] = set()

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        for r, t in self.at.items():
            if r not in self.written and self.monotonic() >= t:
                self.run.stack_file("n0", 0, r).write_text(
                    f"Thread 0x1 (most recent call first):\n  rank {r}\n"
                )
                self.written.add(r)


class Worker:
    def __init__(self, pid: int) -> None:
        self.pid = pid


class Ranks:
    """Four workers with pids no process has: the kernel's state comes from the test, and py-spy
    finds nothing to read."""

    def __init__(self) -> None:
        self.procs = {r: Worker(2**22 + 1000 + r) for r in range(4)}
        self.signals: list[int] = []

    def poll(self) -> dict[int, int | None]:
        return dict.fromkeys(self.procs)

    def signal(self, signum: int) -> None:
        self.signals.append(signum)


def _capture(
    tmp_path: Path, at: dict[int, float], stopped: frozenset[int] = frozenset()
) -> tuple[dict[int, str], float, Ranks]:
    run = RunDir(tmp_path)
    run.stacks.mkdir(parents=True)
    clock, ranks = Answering(run, at), Ranks()
    by_pid = {w.pid: r for r, w in ranks.procs.items()}
    files = AttemptFiles(
        run, "n0", 0, clock, ranks, [], GRACE, state_of=lambda pid: "T" if by_pid[pid] in stopped else "S"
    )
    got = files.capture_stacks()
    return got, clock.monotonic(), ranks


def test_every_rank_answering_at_once_ends_the_wait_at_once(tmp_path):
    got, took, ranks = _capture(tmp_path, dict.fromkeys(range(4), 0.1))
    assert sorted(got) == [0, 1, 2, 3] and "rank 2" in got[2]
    assert took < 0.5 and ranks.signals == [signal.SIGUSR2]


def test_a_rank_that_never_answers_costs_the_short_wait_once_most_did(tmp_path):
    got, took, _ = _capture(tmp_path, {0: 0.1, 1: 0.1, 3: 0.2})  # rank 2 is stopped
    assert sorted(got) == [0, 1, 3]
    assert 0.5 <= took < 0.6


def test_on_a_loaded_machine_the_wait_goes_on_until_most_ranks_answered(tmp_path):
    """One answer within the short wait, two more at 1.2 s: past the short wait only one of four had
    answered, too few to tell the hung rank from its peers, so the wait went on."""
    got, took, _ = _capture(tmp_path, {0: 0.1, 1: 1.2, 3: 1.2})
    assert sorted(got) == [0, 1, 3]
    assert 1.2 <= took < 1.5


def test_the_wait_never_passes_the_stop_grace(tmp_path):
    got, took, _ = _capture(tmp_path, {0: 0.1})
    assert sorted(got) == [0]
    assert took == pytest.approx(GRACE, abs=0.1)


def test_a_stopped_rank_ends_the_wait_however_few_answered(tmp_path):
    """A stopped rank is evidence without any stack (policy/hang_pin.py): the wait does not go on
    past the short one for more answers."""
    got, took, _ = _capture(tmp_path, {0: 0.1, 1: 1.2, 3: 1.2}, stopped=frozenset({2}))
    assert sorted(got) == [0]
    assert 0.5 <= took < 0.6
