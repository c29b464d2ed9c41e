import torch

from stalwart.checkpoint.staging import Stager


def _state():
    torch.manual_seed(1)
    return {
        "model": {"w": torch.randn(64, 32), "b": torch.randn(32)},
        "optim": {"state": [torch.randn(8), {"m": torch.ones(3, dtype=torch.float16)}], "lr": 0.1},
        "step": 7,
        "t": (torch.arange(4), "x"),
    }


def test_snapshot_keeps_values_from_before_in_place_changes():
    state = _state()
    before = {"w": state["model"]["w"].clone(), "m": state["optim"]["state"][1]["m"].clone()}
    snap = Stager(pin=False).stage(3, state)
    state["model"]["w"].add_(1.0)
    state["optim"]["state"][1]["m"].mul_(0)
    state["optim"]["lr"] = 0.5
    assert torch.equal(snap.state["model"]["w"], before["w"])
    assert torch.equal(snap.state["optim"]["state"][1]["m"], before["m"])
    assert snap.state["optim"]["lr"] == 0.1
    assert snap.state["step"] == 7 and snap.state["t"][1] == "x"
    assert snap.state["model"]["w"].data_ptr() != state["model"]["w"].data_ptr()


def test_buffers_are_reused_across_saves_and_hold_the_new_values():
    state = _state()
    stager = Stager(pin=False)
    first = stager.stage(1, state)
    ptr = first.state["model"]["w"].data_ptr()
    allocated = stager.allocated_bytes
    state["model"]["w"].add_(2.0)
    second = stager.stage(2, state)
    assert second.state["model"]["w"].data_ptr() == ptr
    assert stager.allocated_bytes == allocated
    assert torch.equal(second.state["model"]["w"], state["model"]["w"])
    assert second.generation == first.generation + 1


def test_bytes_counts_every_tensor_and_shape_change_reallocates():
    state = _state()
    stager = Stager(pin=False)
    snap = stager.stage(1, state, {"rng": torch.get_rng_state()})
    expected = (
        sum(
            t.numel() * t.element_size()
            for t in (
                state["model"]["w"],
                state["model"]["b"],
                state["optim"]["state"][0],
                state["optim"]["state"][1]["m"],
                state["t"][0],
            )
        )
        + torch.get_rng_state().numel()
    )
    assert snap.bytes == expected
    state["model"]["w"] = torch.randn(10, 10)
    snap2 = stager.stage(2, state)
    assert snap2.state["model"]["w"].shape == (10, 10)
    assert stager.allocated_bytes == expected - 64 * 32 * 4 + 100 * 4


def test_shared_memory_buffers_when_no_cuda():
    stager = Stager(pin=False, shared=True)
    snap = stager.stage(1, {"w": torch.randn(16)})
    assert snap.state["w"].is_shared()


def test_stall_is_measured_with_the_injected_clock():
    ticks = iter([10.0, 10.25])
    snap = Stager(pin=False, clock=lambda: next(ticks)).stage(1, {"w": torch.zeros(4)})
    assert snap.stall_s == 0.25
