"""A Hugging Face ``Trainer`` run's left state (integrations/hf_left.py), over stand-in objects: the
``checkpoint-N`` directory a survivor writes from its excepthook on a peer's failure, when it writes
nothing, which one the restart takes, and the clean-up after the first resumed step. The real
``Trainer`` run: tests/e2e/test_framework_integrations.py."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

from stalwart.integrations.hf_left import NAMES, STATE_FILE, HfLeft  # noqa: E402

PEER_GONE = RuntimeError("Connection closed by peer [127.0.0.1]:29500")


class Config:
    def to_json_file(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"model_type": "stand-in"}, f)


class Model(torch.nn.Module):
    """Two tied weights, as a language model's embedding and head are."""

    def __init__(self) -> None:
        super().__init__()
        self.config = Config()
        self.emb = torch.nn.Embedding(4, 2)
        self.head = torch.nn.Linear(2, 4, bias=False)
        self.head.weight = self.emb.weight


class State:
    def __init__(self, step: int) -> None:
        self.global_step = step

    def save_to_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"global_step": self.global_step}, f)


def _objects() -> tuple[Model, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, 3)


def _step(opt: torch.optim.Optimizer) -> None:
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    opt.step()


def test_a_survivor_leaves_a_checkpoint_directory_of_the_last_completed_step_from_its_excepthook(tmp_path):
    left = HfLeft(tmp_path, "n0", 1, 1, 0)
    model, opt, sched = _objects()
    called = []
    before = sys.excepthook
    sys.excepthook = lambda *a: called.append(a[1])
    try:
        _step(opt)
        sched.step()
        left.step_ended(State(5), model, opt, sched)
        left.chain()
        sys.excepthook(RuntimeError, PEER_GONE, None)
        path = NAMES.path(tmp_path, "n0", 1, 5, 0)
        assert sorted(p.name for p in path.iterdir()) == [
            "config.json",
            "model.safetensors",
            "optimizer.pt",
            "scheduler.pt",
            STATE_FILE,
        ]
        # the weights, whichever rank this is (save_pretrained writes on the group's rank 0 only)
        weights = load_file(path / "model.safetensors")
        assert torch.equal(next(iter(weights.values())), model.emb.weight.detach())
        assert json.loads((path / STATE_FILE).read_text()) == {"global_step": 5}
        assert torch.load(path / "scheduler.pt", weights_only=True)["last_epoch"] == 1
        assert "momentum_buffer" in str(torch.load(path / "optimizer.pt", weights_only=True)["state"])
        assert called == [PEER_GONE]  # the hook that was there (the SDK's) still runs, after
        left.close()
        assert sys.excepthook is not left._excepthook
    finally:
        sys.excepthook = before
        left.close()


@pytest.mark.parametrize("case", ["not a peer's failure", "optimizer stepped", "no step completed"])
def test_nothing_is_left_when_it_would_not_be_the_last_completed_steps_state(tmp_path, case):
    notes: list[str] = []
    left = HfLeft(tmp_path, "n0", 0, 0, 0, notes.append)
    model, opt, sched = _objects()
    try:
        if case != "no step completed":
            left.step_ended(State(5), model, opt, sched)
        if case == "optimizer stepped":
            _step(opt)  # the interrupted step's update was applied
        left._excepthook(
            RuntimeError, ValueError("bad") if case == "not a peer's failure" else PEER_GONE, None
        )
        assert not list(tmp_path.glob("hf-left-*")) and not list(tmp_path.glob(".hf-left-*"))
        match case:
            case "not a peer's failure":
                assert notes == []
            case "optimizer stepped":
                assert "optimizer had stepped" in notes[0]
            case _:
                assert "before its first completed step" in notes[0]
    finally:
        left.close()


def test_the_restart_takes_a_whole_left_directory_newer_than_the_checkpoint_and_removes_it_after_a_step(
    tmp_path,
):
    whole, torn = NAMES.path(tmp_path, "n0", 0, 9, 0), NAMES.path(tmp_path, "n0", 1, 8, 0)
    whole.mkdir()
    (whole / STATE_FILE).write_text("{}")
    torn.mkdir()  # no trainer_state.json: a write cut short is never taken (it holds the lowest step)
    left = HfLeft(tmp_path, "n0", 0, 0, 1)  # the restart: attempt 1 takes what attempt 0 left
    try:
        assert left.resume(newest_checkpoint=8) is None  # the lowest step left is the torn one
        torn.rmdir()
        assert left.resume(newest_checkpoint=9) is None  # not newer than the checkpoint
        got = left.resume(newest_checkpoint=8)
        assert got is not None and (got.step, got.source) == (9, 0)
        torch.manual_seed(3)
        left.rng.write(9)  # what the original run recorded as step 9 began
        want = torch.rand(3)
        torch.manual_seed(4)
        assert left.step_began(9) == ""  # the first resumed step restores that record
        assert torch.equal(torch.rand(3), want)
        model, opt, sched = _objects()
        left.step_ended(State(10), model, opt, sched)
        assert not whole.exists()
    finally:
        left.close()
