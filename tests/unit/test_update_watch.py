"""The one rule every holder of live state applies (train/update_watch.py): an update that landed in
the step in progress, told by torch's global optimizer step post-hook."""

from __future__ import annotations

import torch

from stalwart.train.update_watch import UpdateWatch


def _update() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    torch.optim.AdamW([p], lr=0.1).step()


def test_an_update_counts_until_the_next_boundary():
    watch = UpdateWatch()
    try:
        assert not watch.landed()
        _update()
        assert watch.landed()  # the models are past the step's start
        watch.boundary()
        assert not watch.landed()  # a new step: that update belongs to a completed one
    finally:
        watch.close()


def test_on_the_owners_count_an_update_is_placed_at_the_steps_completed_when_it_landed():
    completed = [17]
    watch = UpdateWatch(lambda: completed[0])
    try:
        _update()  # in the step after 17 completed ones
        assert watch.landed(17) and watch.landed()
        completed[0] = 18  # that step completed: a failure now finds the objects at its end
        assert not watch.landed(18) and not watch.landed()
        assert watch.landed(17)
        watch.forget()  # a re-formed group's new objects: none of their updates landed
        assert not watch.landed(17)
    finally:
        watch.close()


def test_a_closed_watch_hears_no_more_updates():
    watch = UpdateWatch()
    watch.close()
    _update()
    assert not watch.landed()
