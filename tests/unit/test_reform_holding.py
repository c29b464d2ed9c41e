"""What a surviving rank holds for the re-formed group (train/reform.py ``Reformer.holding``): the
state after its completed steps, unless an update of the interrupted step already landed; the copy
from before a failed commit only where it is the step asked about."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from stalwart.train.reform import Reformer
from stalwart.train.state import Captured

SPARE = Captured({}, {"objects": {}})


def _reformer(stepped_at: int, spare: tuple[int, Captured] | None, boundary_step: int) -> Reformer:
    r = Reformer(SimpleNamespace(), None, 1.0, Path("/nonexistent"))  # type: ignore[arg-type]
    state: dict[str, Any] = {"model": object()}
    r.state, r.stepped_at, r.spare = state, stepped_at, spare
    r.boundary = (boundary_step, {"data": {"pos": boundary_step}})
    return r


def test_a_survivor_between_its_backward_and_its_update_holds_its_completed_steps():
    held = _reformer(stepped_at=16, spare=None, boundary_step=17).holding(17)
    assert (held.step, held.boundary, held.before) == (17, {"data": {"pos": 17}}, None)


def test_a_survivor_whose_update_landed_in_the_interrupted_step_holds_nothing_but_its_copy():
    assert _reformer(stepped_at=17, spare=None, boundary_step=17).holding(17).step == -1
    held = _reformer(stepped_at=17, spare=(17, SPARE), boundary_step=17).holding(17)
    assert (held.step, held.before) == (-1, (17, SPARE))  # the copy is the state after 17 steps


def test_a_copy_from_a_failed_commit_counts_only_as_the_step_before():
    held = _reformer(stepped_at=17, spare=(17, SPARE), boundary_step=18).holding(18)
    assert (held.step, held.boundary, held.before) == (18, {"data": {"pos": 18}}, (17, SPARE))
    stale = _reformer(stepped_at=20, spare=(17, SPARE), boundary_step=21).holding(21)
    assert (stale.step, stale.before) == (21, None)  # a copy of another step is not offered
