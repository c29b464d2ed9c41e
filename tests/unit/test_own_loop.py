"""``Session.track``: a script's own loop, in-process without an agent: steps ended by ``done()``,
checkpoints when due, a resume that returns the steps done and ends bit-identical to an uninterrupted
run (an LR scheduler stepped after the update included), and misuse refused."""

from __future__ import annotations

import pytest
import torch

# the same model, data and optimizer as the loop's own standalone test: the results compare
from test_session_standalone import TOTAL, Boom, make_state, reference_params, train_step

from stalwart.events import CheckpointCommitted, TrainingFinished, TrainingResumed
from stalwart.ledger import read_merged
from stalwart.train import Session


def own_loop(env, seed: int, crash_at: int | None = None):
    """The script's own loop: epochs of 3 batches, its own step counter, ``done()`` after each step's
    last change of the state."""
    with Session(env) as sess:
        model, opt, sched = make_state(seed)  # the scheduler steps after the update, in the step
        data = {"pos": 0}
        state = {"model": model, "optimizer": opt, "scheduler": sched, "data": data}
        starts = []
        try:
            with sess.track(state, total_steps=TOTAL, checkpoint_every=2) as steps:
                starts.append(steps.start)
                for epoch in range(steps.start // 3, -(-TOTAL // 3)):
                    for step in range(max(steps.start, epoch * 3), min(TOTAL, epoch * 3 + 3)):
                        if step == crash_at:
                            raise Boom(step)
                        train_step(model, opt, sched, data)
                        steps.done()
        except Boom:
            pass
        finally:
            sess.finish()
    return sess, model, data, starts[0]


def test_a_crash_and_a_resume_in_an_own_loop_end_bit_identical(tmp_path):
    env = {"STALWART_W_RUN_DIR": str(tmp_path / "run")}
    first, _, _, start = own_loop(env, seed=0, crash_at=5)
    assert start == 0 and first.completed == 5  # steps 0-4 done
    assert first._step == 5  # the step the error struck stays in progress: its error record names it

    second, model, data, start = own_loop(env, seed=123)  # another seed: the resume overwrites it all
    assert start == 4  # the newest checkpoint (every 2 steps) before the crash
    assert second.completed == TOTAL and data["pos"] == 4 * TOTAL
    for a, b in zip(model.parameters(), reference_params(), strict=True):
        assert torch.equal(a.detach(), b)

    events = read_merged(tmp_path / "run")
    saved = sorted({e.step for e in events if isinstance(e, CheckpointCommitted)})
    assert saved == [2, 4, 6, 8], saved  # the run's end is made durable too
    assert [e.step for e in events if isinstance(e, TrainingResumed)] == [0, 4]
    assert [e.step for e in events if isinstance(e, TrainingFinished)] == [TOTAL]  # not after the crash


def test_done_outside_the_block_is_refused_and_the_block_is_used_once(tmp_path):
    with Session({"STALWART_W_RUN_DIR": str(tmp_path / "run")}) as sess:
        model, opt, sched = make_state(0)
        tracked = sess.track({"model": model, "optimizer": opt})
        with pytest.raises(RuntimeError, match="inside its `with session.track"):
            tracked.done()
        with tracked as steps:
            assert steps.start == 0 and steps.step == 0
            train_step(model, opt, sched, {"pos": 0})
            steps.done()
            assert steps.step == 1
            with pytest.raises(RuntimeError, match="already in use"):
                tracked.__enter__()
        with pytest.raises(RuntimeError, match="inside its `with session.track"):
            tracked.done()
        assert sess.completed == 1
        sess.finish()


def test_bad_counts_are_refused_before_anything_runs(tmp_path):
    with Session({"STALWART_W_RUN_DIR": str(tmp_path / "run")}) as sess:
        model, opt, _ = make_state(0)
        with pytest.raises(ValueError, match="total_steps must be >= 0"):
            sess.track({"model": model, "optimizer": opt}, total_steps=-1)
        for bad in (-3, 2.5, "10", True):
            with pytest.raises(ValueError, match="checkpoint_every must be a number of steps"):
                sess.track({"model": model, "optimizer": opt}, checkpoint_every=bad)
        sess.finish()
