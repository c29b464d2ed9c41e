"""The SDK's state split (sharded tensors via DCP + plain per-rank extras) through the engine,
single process: exact round trip, fallback, retention, and no unpickling of objects."""

from __future__ import annotations

import copy
import io
import random

import numpy as np
import pytest
import torch

from stalwart.checkpoint.engine import CheckpointEngine
from stalwart.checkpoint.manifest import MANIFEST, FileEntry, Manifest, sha256_file
from stalwart.checkpoint.tiers import TierConfig
from stalwart.errors import CheckpointError
from stalwart.events import CheckpointCommitted, CheckpointRejected
from stalwart.train import state as state_io

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

CALLED: list[str] = []


def _record(tag: str) -> str:
    CALLED.append(tag)
    return tag


class Evil:
    """Unpickling this object calls ``_record``: what a tampered checkpoint would do."""

    def __reduce__(self):
        return (_record, ("unpickled",))


def make(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return {"model": model, "optimizer": opt, "scheduler": sched, "data": {"pos": 0}}


def train(state, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(4, 8)
        loss = state["model"](x).pow(2).mean()
        state["optimizer"].zero_grad()
        loss.backward()
        state["optimizer"].step()
        state["scheduler"].step()
        state["data"]["pos"] += 4


def same(a, b) -> bool:
    if isinstance(a, dict):
        return set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b) and a.dtype == b.dtype
    return a == b


def engine(tmp_path, events, keep=2):
    tiers = [
        TierConfig(name="mem", kind="memory", location=str(tmp_path / "shm"), keep=keep),
        TierConfig(name="local", kind="local", location=str(tmp_path / "ck"), keep=keep),
    ]
    return CheckpointEngine(tiers, sink=events.append, on_busy="wait")


def save(eng, step, state):
    cap = state_io.capture(state)
    return eng.save(step, cap.sharded, cap.extras, force=True)


def load(eng, state):
    targets = state_io.load_targets(state)
    got = eng.load_latest(targets.tensors)
    if got is not None:
        state_io.apply(state, targets, got.rank_state or {}, own_rng=True)
    else:
        state_io.forget_init(targets.fresh)
    return got


def test_round_trip_restores_every_part_exactly_even_if_training_goes_on(tmp_path):
    events = []
    eng = engine(tmp_path, events)
    a = make(0)
    train(a, 3)
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    expected = {k: (v.state_dict() if hasattr(v, "state_dict") else dict(v)) for k, v in a.items()}
    expected = copy.deepcopy(expected)
    save(eng, 3, a)
    after = (random.random(), float(np.random.rand()), torch.rand(3))  # what the RNGs give next
    train(a, 2)  # the loop goes on right away: the checkpoint keeps the values from before
    eng.wait()
    b = make(1)
    got = load(eng, b)
    assert got.step == 3 and got.rank_state_from == 0
    for key in ("model", "optimizer", "scheduler"):
        assert same(b[key].state_dict(), expected[key]), key
    assert b["data"] == {"pos": 12}
    assert b["optimizer"].param_groups[0]["betas"] == (0.8, 0.99)
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert again[:2] == after[:2] and torch.equal(again[2], after[2])  # every RNG restored
    assert {e.tier for e in events if isinstance(e, CheckpointCommitted)} == {"mem", "local"}
    eng.close()


def _buffer(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_a_damaged_extras_file_falls_back_and_retention_keeps_the_newest_good(tmp_path):
    events = []
    eng = engine(tmp_path / "x", events)
    eng.tiers = [t for t in eng.tiers if t.name == "local"]
    st = make(0)
    for step in (1, 2, 3):
        train(st, 1)
        save(eng, step, st)
        eng.wait()
    kept = sorted(p.name for p in (tmp_path / "x" / "ck").iterdir() if p.name.startswith("step-"))
    assert kept == ["step-000000002", "step-000000003"]
    data = tmp_path / "x" / "ck" / "step-000000003" / "rank-0.pt"
    data.write_bytes(data.read_bytes()[:-3])
    b = make(9)
    got = load(eng, b)
    assert got.step == 2 and b["data"] == {"pos": 8}
    assert any(isinstance(e, CheckpointRejected) and e.step == 3 for e in events)
    eng.close()


def _forge(version, name: str, payload) -> None:
    """Replace a file and rewrite the manifest's digest for it, as someone with write access could
    when no manifest key is configured (with a key the MAC would refuse the version first)."""
    (version / name).write_bytes(_buffer(payload).getvalue())
    m = Manifest.from_json((version / MANIFEST).read_text())
    files = dict(m.files)
    files[name] = FileEntry(size=(version / name).stat().st_size, sha256=sha256_file(version / name))
    (version / MANIFEST).write_text(m.model_copy(update={"files": files}).to_json())


def test_a_pickled_callable_in_the_extras_is_refused_and_the_previous_checkpoint_loads(tmp_path):
    events = []
    eng = engine(tmp_path, events)
    eng.tiers = [t for t in eng.tiers if t.name == "local"]
    st = make(0)
    for step in (1, 2):
        train(st, 1)
        save(eng, step, st)
        eng.wait()
    _forge(tmp_path / "ck" / "step-000000002", "rank-0.pt", {"format": 1, "objects": {"data": Evil()}})
    CALLED.clear()
    b = make(9)
    got = load(eng, b)
    assert CALLED == []  # nothing from the file ran
    assert got.step == 1 and b["data"] == {"pos": 4}
    rejected = [e for e in events if isinstance(e, CheckpointRejected)]
    assert len(rejected) == 1 and rejected[0].step == 2
    assert "rank-0.pt holds more than tensors and plain data" in rejected[0].reason
    assert "\n" not in rejected[0].reason
    eng.close()


def test_state_that_needs_pickle_is_refused_at_save_with_one_clear_line():
    st = make(0)
    st["data"] = {"fn": lambda x: x}
    with pytest.raises(CheckpointError, match="extras/objects/data/fn is a builtins.function"):
        state_io.capture(st)
    st["data"] = {"pos": np.int64(3)}
    with pytest.raises(CheckpointError, match="numpy"):
        state_io.capture(st)


def test_a_checkpoint_for_another_model_is_a_clear_error(tmp_path):
    events = []
    eng = engine(tmp_path, events)
    save(eng, 1, make(0))
    eng.wait()
    other = make(0)
    other["model"] = torch.nn.Linear(8, 4)
    other["optimizer"] = torch.optim.AdamW(other["model"].parameters())
    other["scheduler"] = torch.optim.lr_scheduler.StepLR(other["optimizer"], 2)
    with pytest.raises(CheckpointError, match="does not fit"):
        load(eng, other)
    eng.close()


def test_a_fresh_start_and_an_early_save_leave_the_optimizer_untouched(tmp_path):
    events = []
    eng = engine(tmp_path, events)
    st, plain = make(0), make(0)
    assert load(eng, st) is None
    assert not st["optimizer"].state  # get_optimizer_state_dict initialised it; the SDK undid that
    state_io.capture(st)
    assert not st["optimizer"].state
    torch.manual_seed(3)
    train(st, 2)
    torch.manual_seed(3)
    train(plain, 2)
    assert same(st["optimizer"].state_dict(), plain["optimizer"].state_dict())
    assert int(st["optimizer"].state_dict()["state"][0]["step"]) == 2
    eng.close()
