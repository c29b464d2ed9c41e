"""What a surviving rank holds for the re-formed group (train/reform.py ``Reformer.holding``): the
state after its completed steps, unless an update of the interrupted step already landed; the copy
from before a failed commit only where it is the step asked about."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from stalwart.train.reform import Reformer
from stalwart.train.state import Captured
from stalwart.train.update_watch import UpdateWatch

SPARE = Captured({}, {"objects": {}})
_WATCHES: list[UpdateWatch] = []


@pytest.fixture(autouse=True)
def _close_watches() -> Iterator[None]:
    yield
    while _WATCHES:
        _WATCHES.pop().close()


def _reformer(stepped_at: int, spare: tuple[int, Captured] | None, boundary_step: int) -> Reformer:
    """A survivor whose optimizer last stepped when ``stepped_at`` steps were complete (a real update:
    the global optimizer step hook records it)."""
    r = Reformer(SimpleNamespace(), None, 1.0, Path("/nonexistent"))  # type: ignore[arg-type]
    completed = [stepped_at]
    r._updates = UpdateWatch(lambda: completed[0])
    _WATCHES.append(r._updates)
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    torch.optim.SGD([p], lr=0.1).step()
    completed[0] = boundary_step
    state: dict[str, Any] = {"model": object()}
    r.state, r.spare = state, spare
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
