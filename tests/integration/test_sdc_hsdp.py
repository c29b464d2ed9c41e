"""The replica check under HSDP: 4 gloo ranks on CPU, a 2x2 mesh (replicate, shard), ``fully_shard``.
Ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1. A bit flipped in rank 1's local shard makes its
replica group disagree: with two replicas that is a pair (nobody named), every rank rolls back, and
the replay of that step (here the flip undone, as a deterministic replay of a transient fault would
recompute it) names rank 1 within its group.

Run as a script, this file is one rank (see ``_worker``)."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


def _step(model, opt, step):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    (model(torch.randn(8, 16, generator=g)) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()


def _flip(model):
    import torch

    with torch.no_grad():
        bits = next(iter(model.parameters())).to_local().view(torch.int32).view(-1)
        bits[0] ^= 1 << 23  # the lowest exponent bit: the value doubles or halves


def _worker(out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from stalwart.train.clock import SystemClock
    from stalwart.train.replica_check import ReplicaCheck

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    events, notes, told = [], [], []
    check = ReplicaCheck(
        every=1,
        budget=0.01,
        rank=rank,
        node=f"node{rank}",
        clock=SystemClock(),
        emit=events.append,
        note=notes.append,
        context=dict,
        tell=told.append,
    )
    state = {"model": model, "optim": opt}
    check.begin(state, 0, resumed=True)  # step 0 loaded and agreed on: verified clean
    _step(model, opt, 0)
    first = check.verify(1, False)
    _step(model, opt, 1)
    if rank == 1:
        _flip(model)
    found = check.verify(2, False)
    replays = {str(k): list(v.group) for k, v in check.replays.items()}
    if rank == 1:
        _flip(model)  # the replay of step 2 recomputes the clean state
    check.verify(2, False)
    result = {
        "placements": [str(p) for p in next(iter(model.parameters())).placements],
        "active": check.active,
        "first": first,
        "found": found,
        "replays": replays,
        "notes": notes,
        "events": [
            (type(e).__name__, getattr(e, "verdict", ""), list(getattr(e, "suspect_ranks", ())))
            for e in events
        ],
        "replay": [getattr(e, "replay", "") for e in events],
        "told": [(m.verdict, list(m.suspect_ranks), list(m.suspect_nodes)) for m in told],
    }
    plain = torch.nn.Linear(16, 8)
    fully_shard(plain, mesh=init_device_mesh("cpu", (4,)))  # plain FSDP: every rank a different shard
    fsdp = ReplicaCheck(
        every=1,
        budget=0.01,
        rank=rank,
        node="n",
        clock=SystemClock(),
        emit=events.append,
        note=notes.append,
        context=dict,
    )
    fsdp.begin({"model": plain}, 0, resumed=True)
    result["fsdp"] = [fsdp.active, notes[-1] if rank == 0 else ""]
    Path(out, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_flipped_bit_in_one_shard_is_a_pair_within_its_replica_group_and_the_replay_names_it(tmp_path):
    import warm  # deferred: here, not at the top: each rank runs this file as a script
    from netutil import free_port  # deferred: as warm

    port = free_port()
    procs = [warm.start(HERE, [str(tmp_path)], warm.rank_env(r, 4, port)) for r in range(4)]
    for r, (code, o) in enumerate(warm.wait_all(procs, timeout=240)):
        assert code == 0, f"rank {r} failed:\n{o[-3000:]}"
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]
    assert got[0]["placements"] == ["R", "S(0)"]  # (Replicate(), Shard(0))
    for g in got:
        assert g["active"] and g["first"] == -1 and g["notes"][:1] != ["silent-data-corruption checks off"]
        assert g["found"] == 0  # every rank rolls back to the clean step 0, whichever group disagreed
        assert g["replays"] == {"2": [1, 3]}  # the replay judges rank 1's replica group
        assert g["told"][0] == ["pair", [], []]  # two replicas of a shard: nobody named
        assert g["told"][1] == ["replayed", [1], ["node1"]]  # named by global rank, within its group
    names = got[0]["events"]
    assert names[0] == ["SilentCorruption", "pair", []] and names[1][0] == "IncidentRaised"
    assert ["SilentCorruption", "replayed", [1]] in names and "transient" in got[0]["replay"]
    assert all(not g["events"] for g in got[1:])  # rank 0 writes the events
    assert not any(g["fsdp"][0] for g in got)
    assert got[0]["fsdp"][1] == (
        "silent-data-corruption checks off: every rank holds a different shard (FSDP/TP): "
        "no replicas of a shard to compare"
    )


if __name__ == "__main__":
    _worker(sys.argv[1])
