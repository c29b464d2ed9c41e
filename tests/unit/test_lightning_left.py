"""A Lightning run's left state (integrations/lightning_left.py), over a stand-in trainer: which file
the restarted group resumes from, what a survivor writes on a peer's failure and when it writes
nothing, and the clean-up. The real Lightning run: tests/e2e/test_lightning_exact.py."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("lightning")

from stalwart.integrations.lightning_left import NAMES, LeftCheckpoint  # noqa: E402

PEER_GONE = RuntimeError("Connection closed by peer [127.0.0.1]:29500")


class Connector:
    """What the left checkpoint asks of Lightning's checkpoint connector: the live checkpoint now, and
    the loops' state (the data position moves on with every batch)."""

    def __init__(self) -> None:
        self.loops = {"fit_loop": {"batch": 0}}
        self.dumped = 0

    def _get_loops_state_dict(self) -> dict:
        return self.loops

    def dump_checkpoint(self, weights_only: bool | None = None) -> dict:
        assert weights_only is False  # the full state: optimizers, schedulers, callbacks
        self.dumped += 1
        return {"state_dict": {"w": torch.ones(3)}, "loops": {"live": True}, "global_step": 99}


def _trainer(step: int) -> SimpleNamespace:
    sched = SimpleNamespace(state_dict=lambda: {"last_epoch": step})
    return SimpleNamespace(
        _checkpoint_connector=Connector(),
        current_epoch=1,
        global_step=step,
        lr_scheduler_configs=[SimpleNamespace(scheduler=sched)],
    )


def _left(tmp_path, rank: int = 0, local_rank: int | None = None, attempt: int = 0) -> LeftCheckpoint:
    """A rank of the agent's ``attempt`` (0 leaves a state; 1, the restart, takes it)."""
    return LeftCheckpoint(tmp_path, "n0", rank, rank if local_rank is None else local_rank, attempt)


def _stepped(left: LeftCheckpoint) -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.ones(1)
    opt.step()  # the global optimizer step hook tells the left checkpoint
    assert left.updates.landed()


def test_a_survivor_leaves_lightnings_checkpoint_of_the_last_completed_step(tmp_path):
    left, trainer = _left(tmp_path), _trainer(7)
    try:
        _stepped(left)
        left.batch_ended(trainer)  # step 7 completed: its loops and schedulers recorded
        trainer._checkpoint_connector.loops = {"fit_loop": {"batch": 8}}  # the next batch was fetched
        assert left.leave(trainer, PEER_GONE) == ""
        path = NAMES.path(tmp_path, "n0", 0, 7, 0)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        got = torch.load(path, weights_only=True)
        assert got["loops"] == {"fit_loop": {"batch": 0}} and got["global_step"] == 7  # the boundary's
        assert got["lr_schedulers"] == [{"last_epoch": 7}] and torch.equal(
            got["state_dict"]["w"], torch.ones(3)
        )
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("lightning-left-")] == [path.name]
    finally:
        left.close()


@pytest.mark.parametrize("case", ["not a peer's failure", "optimizer stepped", "no step completed"])
def test_nothing_is_left_when_it_would_not_be_the_last_completed_steps_state(tmp_path, case):
    left, trainer = _left(tmp_path), _trainer(7)
    try:
        if case != "no step completed":
            _stepped(left)
            left.batch_ended(trainer)
        if case == "optimizer stepped":
            _stepped(left)  # the interrupted step's update was applied: the models are past step 7
        why = left.leave(trainer, ValueError("bad input") if case == "not a peer's failure" else PEER_GONE)
        assert trainer._checkpoint_connector.dumped == 0
        assert not list(tmp_path.glob("lightning-left-*"))
        match case:
            case "not a peer's failure":
                assert why == ""  # the user's own error: the checkpoint decides, nothing to say
            case "optimizer stepped":
                assert "optimizer had stepped" in why
            case _:
                assert "before its first completed step" in why
    finally:
        left.close()


def test_a_batch_whose_optimizer_did_not_step_keeps_the_previous_boundary(tmp_path):
    """Gradient accumulation: a batch end without an optimizer step is no boundary (its gradients are
    in no checkpoint), so a failure after it leaves the state of the last step that did."""
    left, trainer = _left(tmp_path), _trainer(4)
    try:
        _stepped(left)
        left.batch_ended(trainer)
        trainer.global_step, trainer._checkpoint_connector.loops = 4, {"fit_loop": {"batch": 9}}
        left.batch_ended(trainer)  # an accumulating batch: no step
        assert left.leave(trainer, PEER_GONE) == ""
        got = torch.load(NAMES.path(tmp_path, "n0", 0, 4, 0), weights_only=True)
        assert got["loops"] == {"fit_loop": {"batch": 0}}
    finally:
        left.close()


def test_every_rank_resumes_at_the_lowest_step_left_from_its_own_file_when_it_has_one(tmp_path):
    for rank, step in [(0, 12), (2, 11), (3, 11), (1, 12)]:
        NAMES.path(tmp_path, "n0", rank, step, 0).write_bytes(b"x")
    NAMES.path(tmp_path, "n9", 0, 3, 0).write_bytes(b"x")  # another node's name: never taken here
    (tmp_path / "lightning-left-n0-rankX-step1-a0.ckpt").write_bytes(b"x")  # not one of ours
    assert (NAMES.choose(tmp_path, "n0", 3, 1).source, NAMES.choose(tmp_path, "n0", 3, 1).step) == (3, 11)
    for rank in (0, 1, 2):  # ranks 0 and 1 hold step 12 only: the lowest rank's file at step 11
        got = NAMES.choose(tmp_path, "n0", rank, 1)
        assert (got.source, got.step) == (2, 11)
    assert NAMES.choose(tmp_path / "none", "n0", 0, 1) is None


def test_only_the_attempt_right_after_the_one_that_left_a_state_takes_it(tmp_path):
    """Every rank of an attempt has its number, so they agree without talking; an attempt that took
    the state and failed before its first step removed it is followed by one that does not take it
    again (it resumes from the checkpoint instead of failing the same way)."""
    NAMES.path(tmp_path, "n0", 0, 5, 3).write_bytes(b"x")
    assert NAMES.choose(tmp_path, "n0", 0, 4) is not None
    assert NAMES.choose(tmp_path, "n0", 0, 3) is None and NAMES.choose(tmp_path, "n0", 0, 5) is None


def test_a_left_file_is_taken_only_when_newer_than_the_newest_checkpoint_then_removed(tmp_path):
    NAMES.path(tmp_path, "n0", 0, 8, 0).write_bytes(b"x")
    NAMES.path(tmp_path, "n0", 1, 8, 0).write_bytes(b"x")
    zero, one = _left(tmp_path, 0, attempt=1), _left(tmp_path, 1, attempt=1)
    try:
        assert zero.resume(newest_checkpoint=8) is None  # a checkpoint as new: it is whole and verified
        assert zero.resume(newest_checkpoint=6).step == 8 and one.resume(6).source == 1
        one.forget()  # a rank other than local rank 0 removes its own file only
        assert [p.name for p in tmp_path.glob("lightning-left-*")] == [
            NAMES.path(tmp_path, "n0", 0, 8, 0).name
        ]
        zero.forget()
        assert not list(tmp_path.glob("lightning-left-*"))
    finally:
        zero.close()
        one.close()


def test_the_rng_record_is_written_once_per_optimizer_step_and_restored_at_the_resumed_step(tmp_path):
    left = _left(tmp_path, attempt=1)
    try:
        torch.manual_seed(5)
        left.batch_began(3)
        want = torch.rand(4)
        torch.manual_seed(6)
        left.batch_began(3)  # a second batch of the same step (accumulation): not recorded again
        NAMES.path(tmp_path, "n0", 0, 3, 0).write_bytes(b"x")
        assert left.resume(newest_checkpoint=-1) is not None
        assert left.restore_rng() == ""
        assert torch.equal(torch.rand(4), want)
    finally:
        left.close()
