import pytest
import torch

from stalwart.checkpoint.front import EngineCheckpointManager
from stalwart.checkpoint.tiers import TierConfig
from stalwart.events import CheckpointCommitted, CheckpointRejected

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _shared(seed):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(8, 4)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(4, 8, generator=g))
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(torch.randn(2, 8, generator=g)).sum().backward()
    opt.step()
    return {"model": lin.state_dict(), "optim": opt.state_dict(), "sched": {"last_epoch": seed}}


def _same(a, b):
    if isinstance(a, dict):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b) and a.dtype == b.dtype
    return a == b


def test_front_keeps_the_manager_contract_and_round_trips_exactly(tmp_path):
    events = []
    mgr = EngineCheckpointManager(
        tmp_path / "ck",
        keep=2,
        sink=events.append,
        tiers=[TierConfig(name="mem", kind="memory", location=str(tmp_path / "shm"))],
    )
    shared = _shared(1)
    rank_state = {"rng": torch.get_rng_state(), "data_pos": 41}
    before = shared["model"]["weight"].clone()
    res = mgr.save(5, shared, rank_state)
    shared["model"]["weight"].add_(5.0)  # the training loop goes on immediately
    mgr.wait()
    assert res.step == 5 and res.path == tmp_path / "ck" / "step-000000005" and res.bytes > 0
    assert [s for s, _ in mgr.versions()] == [5]
    got = mgr.load_latest()
    assert got.step == 5 and got.world_size == 1
    assert not torch.equal(got.shared["model"]["weight"], shared["model"]["weight"])
    assert torch.equal(got.shared["model"]["weight"], before)
    assert _same(got.shared["optim"], _shared(1)["optim"]) and got.shared["sched"] == {"last_epoch": 1}
    assert type(got.shared["model"]) is type(shared["model"]) and hasattr(got.shared["model"], "_metadata")
    assert torch.equal(got.rank_state["rng"], rank_state["rng"]) and got.rank_state["data_pos"] == 41
    assert {e.tier for e in events if isinstance(e, CheckpointCommitted)} == {"mem", "local"}
    mgr.close()


def test_front_falls_back_and_retains_like_the_manager(tmp_path):
    events = []
    mgr = EngineCheckpointManager(tmp_path, keep=2, sink=events.append)
    for step in (1, 2, 3):
        mgr.save(step, _shared(step), {"step": step}, emergency=(step == 3))
    mgr.wait()
    assert [s for s, _ in mgr.versions()] == [3, 2]
    data = tmp_path / "step-000000003" / "rank-0.pt"
    data.write_bytes(data.read_bytes()[:-3])
    got = mgr.load_latest()
    assert got.step == 2 and _same(got.shared, _shared(2)) and got.rank_state == {"step": 2}
    assert any(isinstance(e, CheckpointRejected) and e.step == 3 for e in events)
    assert mgr.latest_good()[0].step == 2
    mgr.close()
