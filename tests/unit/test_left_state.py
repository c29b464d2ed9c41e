"""The loop idiom's left state (train/left_state.py): the file a survivor writes on the way out, read
back into fresh objects only when it is whole and fits them; the optimizer-step guard; the take's
choice of file, its note on a file it could not use, and the clean-up."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from stalwart.train.left_state import MAGIC, LeftState, file_for, read_left, write_left
from stalwart.train.live_state import Adopted, LiveStateError
from stalwart.train.state import capture


class Position:
    """A stand-in for a data loader: an object with a state dict that is neither model nor optimizer."""

    def __init__(self) -> None:
        self.at = 0

    def state_dict(self) -> dict[str, int]:
        return {"at": self.at}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.at = sd["at"]


def _state(seed: int, width: int = 8) -> dict:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.Linear(width, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return {"model": model, "optimizer": opt, "data": Position()}


def _train(state: dict, steps: int) -> None:
    for _ in range(steps):
        loss = state["model"](torch.randn(3, 4)).pow(2).mean()
        state["optimizer"].zero_grad()
        loss.backward()
        state["optimizer"].step()
        state["data"].at += 1


def _tensors(state: dict) -> dict[str, torch.Tensor]:
    return {k: t.clone() for k, t in capture(state).sharded.items()}


def test_a_left_state_reads_back_into_fresh_objects_bit_for_bit(tmp_path):
    old = _state(1)
    _train(old, 3)
    path = tmp_path / "left.bin"
    assert write_left(path, old, 3, {"data": {"at": 2}}) == path.stat().st_size
    assert not list(tmp_path.glob(".*.tmp"))  # written under a temporary name, then renamed
    new = _state(2)
    assert read_left(path, new) == 3
    want, got = _tensors(old), _tensors(new)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert new["data"].at == 2  # the other objects as the boundary said, not as they were at the failure


def _flip_last_tensor_byte(path) -> None:
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    at = len(MAGIC) + 8 + size + 5  # inside the first buffer
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, why",
    [
        (_flip_last_tensor_byte, "digest"),
        (lambda p: p.write_bytes(p.read_bytes()[:-40]), "ends inside"),
        (lambda p: p.write_bytes(b"NOTOURS!" + p.read_bytes()[8:]), "not a left state"),
        (lambda p: p.write_bytes(MAGIC + (1 << 40).to_bytes(8, "little")), "header of"),
    ],
    ids=["flipped-bit", "truncated", "foreign", "huge-header"],
)
def test_a_damaged_left_state_is_refused_and_nothing_is_applied(tmp_path, damage, why):
    old = _state(1)
    _train(old, 2)
    path = tmp_path / "left.bin"
    write_left(path, old, 2, None)
    damage(path)
    new = _state(2)
    before = _tensors(new)
    with pytest.raises(LiveStateError, match=why):
        read_left(path, new)
    after = _tensors(new)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_left_state_of_other_objects_is_refused(tmp_path):
    old = _state(1, width=8)
    _train(old, 1)
    write_left(tmp_path / "left.bin", old, 1, None)
    with pytest.raises(LiveStateError, match="does not match"):
        read_left(tmp_path / "left.bin", _state(1, width=16))


def test_a_rank_whose_optimizer_stepped_in_the_interrupted_step_leaves_nothing(tmp_path):
    state = _state(1)
    left = LeftState(tmp_path, "n0", 1, 0, state)
    try:
        left.step_began(5)
        _train(state, 1)  # the update ran; a collective after it failed
        assert "had stepped" in left.leave(5)
        assert not file_for(tmp_path, "n0", 1).exists()
        left.step_ended()  # between steps the objects are at the boundary again
        assert left.leave(6) == ""
        assert read_left(file_for(tmp_path, "n0", 1), _state(2)) == 6
    finally:
        left.close()


def test_a_peer_failure_leaves_the_state_and_another_exception_does_not(tmp_path):
    state = _state(1)
    left = LeftState(tmp_path, "n0", 0, 0, state)
    try:
        left.step_began(4)
        assert left.on_error(ValueError("a bug in the script"), 4) == ""
        assert not file_for(tmp_path, "n0", 0).exists()
        left.on_error(RuntimeError("[gloo] Connection closed by peer [10.0.0.2]:1234"), 4)
        assert file_for(tmp_path, "n0", 0).exists()
    finally:
        left.close()


def _take(tmp_path, node: str, rank: int, local_rank: int, adopt) -> tuple[dict, object]:
    """A fresh rank's take over ``tmp_path`` with a fake ``adopt`` (the collective): its state and
    what it took."""
    new = _state(2)
    left = LeftState(tmp_path, node, rank, local_rank, new)
    try:
        return new, left.take(new, adopt)
    finally:
        left.close()


def test_the_take_uses_a_whole_file_of_the_node_notes_a_bad_one_and_removes_them_all(tmp_path):
    old = _state(1)
    _train(old, 4)
    write_left(file_for(tmp_path, "n0", 0), old, 4, None)
    (file_for(tmp_path, "n0", 1)).write_bytes(b"torn")  # this rank's own file: not whole
    seen = []

    def adopt(state, held, *, restore_rng):
        seen.append(held.step if held is not None else None)
        return Adopted(held.step, 0, 0, "") if held is not None else None

    new, taken = _take(tmp_path, "n0", 1, 0, adopt)
    assert seen == [4] and taken.adopted is not None and taken.adopted.step == 4
    assert "not a left state" in taken.note  # its own file was tried first, and why it was not used
    assert not list(tmp_path.glob("left-state-*"))  # local rank 0 removed every file once taken
    want, got = _tensors(old), _tensors(new)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_rank_with_nothing_on_its_node_takes_part_with_nothing(tmp_path):
    def adopt(state, held, *, restore_rng):
        assert held is None
        return None

    new, taken = _take(tmp_path, "n1", 3, 1, adopt)
    assert taken.adopted is None and taken.note == ""


class Planted:
    """An object ``torch.load(weights_only=True)`` refuses to build (a pickle gadget's stand-in)."""


def test_a_file_whose_extras_would_unpickle_an_object_is_passed_over_and_the_take_goes_on(tmp_path):
    import io
    import json

    old = _state(1)
    _train(old, 2)
    path = file_for(tmp_path, "n0", 0)
    write_left(path, old, 2, None)
    data = path.read_bytes()
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    head = json.loads(data[len(MAGIC) + 8 : len(MAGIC) + 8 + size])
    body = data[len(MAGIC) + 8 + size : len(data) - head["extras"]]
    blob = io.BytesIO()
    torch.save({"plain": [], "objects": {"x": Planted()}, "format": 1}, blob)
    head["extras"] = len(blob.getvalue())
    raw = json.dumps(head).encode()
    path.write_bytes(MAGIC + len(raw).to_bytes(8, "little") + raw + body + blob.getvalue())
    calls = []

    def adopt(state, held, *, restore_rng):
        calls.append(held)
        return None

    new, taken = _take(tmp_path, "n0", 0, 0, adopt)
    assert calls == [None] and taken.adopted is None  # it took part in the collective with nothing
    assert "left-state-n0-rank0.bin" in taken.note and not path.exists()
