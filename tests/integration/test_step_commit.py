"""A sharded step's commit over a real gloo group (FSDP2, two processes), and the live state a rank
serves from its copy of the step before (train/step_commit.py, train/live_state.py).

A peer that dies after its backward and before its update makes the survivor's commit fail: with a
copy of its state kept, the survivor's update lands and the copy holds the step before it; without
one, the failure is raised and nothing is updated."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import warm

pytestmark = pytest.mark.integration


def _commit_worker(rank: int, init: str, keep: bool, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from stalwart.train import state
    from stalwart.train.inplace import is_comm_failure
    from stalwart.train.live_state import _local
    from stalwart.train.step_commit import StepCommit

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    kept: list[dict[str, torch.Tensor]] = []

    def keep_before() -> bool:  # as the Reformer keeps it: a capture of the state, with the group broken
        cap = state.capture({"model": model, "optimizer": opt})
        kept.append({k.removeprefix("model/"): _local(v).clone() for k, v in cap.sharded.items()})
        return keep

    commit = StepCommit(keep_before)
    assert commit.attach({"model": model, "optimizer": opt})
    for step in range(3):
        model(torch.ones(3, 4) * (step + 1)).sum().backward()
        if step == 2 and rank == 1:
            os._exit(0)  # gone after its gradients were reduced, before its commit
        before = {k: v.to_local().clone() for k, v in model.state_dict().items()}
        try:
            opt.step()
        except Exception as exc:  # noqa: BLE001 - recorded for the test, which checks its kind
            assert is_comm_failure(exc), exc
            raised = True
        else:
            raised = False
        opt.zero_grad()
    after = {k: v.to_local() for k, v in model.state_dict().items()}
    changed = any(not torch.equal(before[k], after[k]) for k in after)
    same_copy = len(kept) == 1 and all(torch.equal(kept[0][k], before[k]) for k in before)
    same_copy = same_copy and any(k.startswith("optimizer/") for k in kept[0])  # its moments too
    with open(os.path.join(out, "result.txt"), "w") as f:
        f.write(f"{raised} {changed} {len(kept)} {same_copy}")
    commit.detach()
    os._exit(0)  # the group is broken: no orderly destroy


@pytest.mark.parametrize("keep", [True, False], ids=["copy-kept", "no-copy"])
def test_a_failed_commit_lands_the_update_only_with_a_copy_of_the_step_before(tmp_path, keep):
    init = f"file://{tempfile.mkdtemp()}/store"
    ctx = mp.start_processes(
        _commit_worker,
        args=(init, keep, str(tmp_path)),
        nprocs=2,
        join=False,
        start_method=warm.forkserver(),
    )
    for p in ctx.processes:
        p.join(120)
        assert p.exitcode == 0, p.exitcode
    raised, changed, kept, same = (tmp_path / "result.txt").read_text().split()
    assert kept == "1" and same == "True"  # asked once, with the state before the update
    if keep:
        assert (raised, changed) == ("False", "True")  # the update landed
    else:
        assert (raised, changed) == ("True", "False")  # raised before anything was updated


def _serve_worker(rank: int, init: str, out: str) -> None:
    from stalwart.train import live_state, state

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        old = {"model": model, "optimizer": opt}
        held = None
        if rank == 0:  # a survivor: trained 5 steps, kept a copy, then took a 6th
            for _ in range(5):
                model(torch.ones(3, 4)).sum().backward()
                opt.step()
            cap = state.capture(old)
            copy = state.Captured({k: v.clone() for k, v in cap.sharded.items()}, cap.extras)
            torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "five.pt"))
            model(torch.ones(3, 4)).sum().backward()
            opt.step()
            held = live_state.Held(old, 6, None, (5, copy))
        torch.manual_seed(1)
        fresh = torch.nn.Linear(4, 2)
        new = {"model": fresh, "optimizer": torch.optim.AdamW(fresh.parameters(), lr=0.1)}
        got = live_state.adopt(new, held, restore_rng=lambda step: "")
        assert got is not None
        torch.save({k: v.clone() for k, v in fresh.state_dict().items()}, os.path.join(out, f"got{rank}.pt"))
        with open(os.path.join(out, f"step{rank}.txt"), "w") as f:
            f.write(f"{got.step} {got.source} {got.received > 0}")
    finally:
        dist.destroy_process_group()


def test_a_rank_serves_its_copy_of_the_step_before_when_that_is_where_the_group_resumes(tmp_path):
    init = f"file://{tempfile.mkdtemp()}/store"
    mp.start_processes(
        _serve_worker, args=(init, str(tmp_path)), nprocs=2, join=True, start_method=warm.forkserver()
    )
    five = torch.load(tmp_path / "five.pt")
    # the replacement (rank 1) holds nothing, the survivor steps 6 and 5: the group resumes at 5
    assert (tmp_path / "step0.txt").read_text() == "5 0 False"
    assert (tmp_path / "step1.txt").read_text() == "5 0 True"
    for r in (0, 1):
        got = torch.load(tmp_path / f"got{r}.pt")
        assert all(torch.equal(got[k], five[k]) for k in five), r
