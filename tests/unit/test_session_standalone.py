"""The SDK used in-process without an agent: checkpoint, 'crash', resume, bit-identical result."""

from __future__ import annotations

import torch

from stalwart.events import CheckpointCommitted, CheckpointLoaded, TrainingFinished, TrainingResumed
from stalwart.ledger import read_merged
from stalwart.train import Session

TOTAL = 8


class Boom(Exception):
    pass


def make_state(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def train_step(model, opt, sched, data: dict) -> None:
    x = torch.randn(4, 6)  # draws from the torch RNG: a resume must restore it
    w = torch.arange(6, dtype=torch.float32) * (1 + data["pos"] % 3)
    y = (x @ w).unsqueeze(1)
    data["pos"] += 4
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


def reference_params() -> list[torch.Tensor]:
    model, opt, sched = make_state(0)
    data = {"pos": 0}
    for _ in range(TOTAL):
        train_step(model, opt, sched, data)
    return [p.detach().clone() for p in model.parameters()]


def run_session(env, seed: int, crash_at: int | None = None):
    with Session(env) as sess:  # restores the process hooks it installed on leaving
        model, opt, sched = make_state(seed)
        data = {"pos": 0}
        state = {"model": model, "optimizer": opt, "scheduler": sched, "data": data}
        try:
            for step in sess.loop(TOTAL, state, checkpoint_every=2):
                if step == crash_at:
                    raise Boom(step)
                with sess.section("data"):
                    pass
                with sess.section("forward"):
                    train_step(model, opt, sched, data)
        except Boom:
            pass
        finally:
            sess.finish()
    return sess, model, data


def test_resume_after_a_crash_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    env = {"STALWART_W_RUN_DIR": str(tmp_path / "run")}
    ref = reference_params()

    first, _, _ = run_session(env, seed=0, crash_at=5)
    assert not first.under_agent and first.world_size == 1 and first.rank == 0
    assert first.completed == 5  # steps 0-4 ran; the last checkpoint holds 4 steps

    # a fresh process would build the model from another seed: resume must overwrite all of it
    second, model, data = run_session(env, seed=123)
    assert second.completed == TOTAL and data["pos"] == 4 * TOTAL
    got = list(model.parameters())
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a.detach(), b)

    events = read_merged(tmp_path / "run" / "ledger")
    commits = sorted(e.step for e in events if isinstance(e, CheckpointCommitted))
    assert commits == [2, 4, 6, 8]
    loaded = [e for e in events if isinstance(e, CheckpointLoaded)]
    assert [e.step for e in loaded] == [4]
    resumed = [e for e in events if isinstance(e, TrainingResumed)]
    # the first session starts fresh (a resume from step 0), the second resumes from checkpoint 4
    assert [(e.step, e.from_checkpoint != "") for e in resumed] == [(0, False), (4, True)]
    assert {e.rank for e in resumed} == {0}
    assert [e.step for e in events if isinstance(e, TrainingFinished)] == [TOTAL]


def test_uninterrupted_session_matches_the_plain_loop(tmp_path):
    env = {"STALWART_W_RUN_DIR": str(tmp_path / "run")}
    _, model, _ = run_session(env, seed=0)
    for a, b in zip(model.parameters(), reference_params(), strict=True):
        assert torch.equal(a.detach(), b)


def test_a_finished_run_resumes_to_nothing(tmp_path):
    env = {"STALWART_W_RUN_DIR": str(tmp_path / "run")}
    run_session(env, seed=0)
    again, model, data = run_session(env, seed=7)
    assert again.completed == TOTAL and data["pos"] == 4 * TOTAL  # restored, no step re-run
    # the final state was loaded from a durable tier: nothing to save again, no "not committed" retry
    events = read_merged(tmp_path / "run" / "ledger")
    assert sorted(e.step for e in events if isinstance(e, CheckpointCommitted)) == [2, 4, 6, 8]
    for a, b in zip(model.parameters(), reference_params(), strict=True):
        assert torch.equal(a.detach(), b)
