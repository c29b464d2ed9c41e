"""Reshard 4 -> 2 -> 4 through the engine with real gloo processes and DTensor-sharded state.

Run as a script, this file is one rank of a phase (see ``_worker``)."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


def _model_and_opt(mesh, seed):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            m.weight = torch.nn.Parameter(distribute_tensor(m.weight.data, mesh, [Shard(0)]))
            m.bias = torch.nn.Parameter(distribute_tensor(m.bias.data, mesh, [Shard(0)]))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train_step(model, opt, mesh, step):
    import torch
    from torch.distributed.tensor import Replicate, distribute_tensor

    g = torch.Generator().manual_seed(1000 + step)
    x = distribute_tensor(torch.randn(8, 16, generator=g), mesh, [Replicate()])
    out = model(x)
    (out * out).mean().backward()
    opt.step()
    opt.zero_grad()


def _full(state):
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return {k: _full(v) for k, v in state.items()}
    if isinstance(state, DTensor):
        return state.full_tensor()
    if isinstance(state, torch.Tensor):
        return state.clone()
    return state


def _worker(phase: str, src: str, dst: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from stalwart.checkpoint.engine import CheckpointEngine
    from stalwart.checkpoint.tiers import TierConfig

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, ws = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ws,))

    def tiers(path):
        return [TierConfig(name="disk", kind="local", location=path, fsync=False)]

    if phase == "a":
        model, opt = _model_and_opt(mesh, seed=0)
        for s in range(2):
            _train_step(model, opt, mesh, s)
    else:
        model, opt = _model_and_opt(mesh, seed=123)  # different values: the load must overwrite them
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "meta": {"seen": 0}}
        eng = CheckpointEngine(tiers(src), rank=rank, world_size=ws)
        got = eng.load_latest(state)
        eng.close()
        assert got is not None and got.step == 2, got
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert state["meta"]["seen"] == 2 and got.world_size == (4 if phase == "b" else 2)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "meta": {"seen": 2}}
    full = _full(state)
    if dst:
        eng = CheckpointEngine(tiers(dst), rank=rank, world_size=ws)
        assert eng.save(2, state, {"rank": rank}).future.result().committed == ("disk",)
        eng.close()
    _train_step(model, opt, mesh, 2)
    after = _full(dict(zip(("model", "optim"), get_state_dict(model, opt), strict=True)))
    if rank == 0:
        torch.save({"at_save": full, "after_step": after}, out)
    dist.destroy_process_group()


def _run_phase(phase: str, ws: int, src: Path | None, dst: Path | None, out: Path) -> None:
    import warm  # deferred: here, not at the top: each rank runs this file as a script
    from netutil import free_port  # deferred: as warm

    port = free_port()
    args = [phase, str(src or ""), str(dst or ""), str(out)]
    procs = [warm.start(HERE, args, warm.rank_env(r, ws, port)) for r in range(ws)]
    for r, (code, o) in enumerate(warm.wait_all(procs, timeout=240)):  # ranks forked warm
        assert code == 0, f"phase {phase} rank {r} failed:\n{o[-3000:]}"


def _assert_same(a, b, where=""):
    import torch

    if isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, where


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_reshard_4_to_2_to_4_gives_the_same_model_and_optimizer(tmp_path):
    import torch

    a, b = tmp_path / "ws4", tmp_path / "ws2"
    _run_phase("a", 4, None, a, tmp_path / "a.pt")
    _run_phase("b", 2, a, b, tmp_path / "b.pt")
    _run_phase("c", 4, b, None, tmp_path / "c.pt")
    ref, mid, end = (torch.load(tmp_path / f"{p}.pt", weights_only=True) for p in "abc")
    assert len(ref["at_save"]["optim"]["state"]) == 4  # two layers x (weight, bias), each with Adam moments
    _assert_same(ref["at_save"], mid["at_save"], "4->2")
    _assert_same(ref["at_save"], end["at_save"], "4->2->4")
    # training on from the resharded state is bit-identical to training on without resharding
    _assert_same(ref["after_step"], end["after_step"], "next step")
    assert not torch.equal(ref["after_step"]["model"]["0.weight"], ref["at_save"]["model"]["0.weight"])
    manifests = sorted(p.name for p in (a / "step-000000002").iterdir())
    assert manifests.count("MANIFEST.json") == 1 and "__3_0.distcp" in manifests


if __name__ == "__main__":
    _worker(*sys.argv[1:5])
