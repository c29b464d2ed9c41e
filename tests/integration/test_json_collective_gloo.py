"""JSON over tensor collectives on a real gloo group of three processes: values arrive whole on every
rank, and a rank that sends a pickle (or announces a length past the cap) is refused by name with
nothing unpickled."""

from __future__ import annotations

import json
import os
import pickle
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import warm

pytestmark = pytest.mark.integration

WORLD = 3
ROGUE = 2


class _Plant:
    """Unpickling this makes the directory ``path``: the proof that a payload ran as code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _rogue_gather(data: bytes, announce: int) -> None:
    """Rank ROGUE's side of all_gather_json, with its own bytes and length."""
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(lengths, torch.tensor([announce], dtype=torch.int64))
    sizes = [int(t.item()) for t in lengths]
    if any(s > 1 << 20 or s < 0 for s in sizes):
        return  # the honest ranks refuse the lengths and send no payload
    widest = max(sizes)
    buf = torch.zeros(widest, dtype=torch.uint8)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.all_gather([torch.empty(widest, dtype=torch.uint8) for _ in range(WORLD)], buf)


def _rogue_broadcast(data: bytes) -> None:
    dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), ROGUE)
    dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), ROGUE)


def _honest(case: str, rank: int, out: str) -> dict:
    from stalwart.checkpoint.collective import Collective
    from stalwart.protocol.json_collective import PeerDataError, all_gather_json, broadcast_json

    if case == "ok":
        mine = {"rank": rank, "pad": "x" * (1000 * rank), "f": 0.1 * rank, "none": None}
        comm = Collective.create(WORLD)  # the engine's own gloo group
        return {
            "gathered": all_gather_json(mine),
            "broadcast": broadcast_json(mine if rank == 1 else "ignored", 1),
            "strs": comm.all_gather_str(f"r{rank}"),
            "outcome": list(comm.broadcast_outcome(rank == 0, f"from {rank}")),
        }
    refused = []
    for step in ("gather", "broadcast"):
        try:
            if step == "gather":
                all_gather_json({"rank": rank}, limit=1 << 20)
            else:
                broadcast_json(None, ROGUE, limit=1 << 20)
            refused.append("accepted")
        except PeerDataError as exc:
            refused.append(str(exc))
        if case == "length":
            break
    return {"refused": refused}


def _worker(rank: int, init: str, case: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        if rank == ROGUE and case != "ok":
            payload = pickle.dumps(_Plant(os.path.join(out, "planted")))
            if case == "length":
                _rogue_gather(b"", 10**12)
            else:
                _rogue_gather(payload, len(payload))
                _rogue_broadcast(payload)
            return
        got = _honest(case, rank, out)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
            json.dump(got, fh)
    finally:
        dist.destroy_process_group()


def _run(case: str, out: str) -> list[dict]:
    init = f"file://{tempfile.mkdtemp()}/store"
    mp.start_processes(
        _worker, args=(init, case, out), nprocs=WORLD, join=True, start_method=warm.forkserver()
    )  # ranks forked warm
    ranks = range(WORLD) if case == "ok" else [r for r in range(WORLD) if r != ROGUE]
    return [json.loads(open(os.path.join(out, f"rank{r}.json")).read()) for r in ranks]


def test_values_arrive_whole_on_every_rank(tmp_path):
    every = [{"rank": r, "pad": "x" * (1000 * r), "f": 0.1 * r, "none": None} for r in range(WORLD)]
    for got in _run("ok", str(tmp_path)):
        assert got["gathered"] == every
        assert got["broadcast"] == every[1]
        assert got["strs"] == [f"r{r}" for r in range(WORLD)]
        assert got["outcome"] == [True, "from 0"]


def test_a_pickle_from_a_peer_is_refused_and_never_unpickled(tmp_path):
    planted = tmp_path / "planted"
    for got in _run("pickle", str(tmp_path)):
        gather, broadcast = got["refused"]
        assert gather.startswith(f"rank {ROGUE} sent ") and "not JSON" in gather and "refused" in gather
        assert broadcast.startswith(f"rank {ROGUE} sent ") and "not JSON" in broadcast
    assert not planted.exists()
    # the payload is live: torch's object collectives would have run it on every rank
    pickle.loads(pickle.dumps(_Plant(str(planted))))
    assert planted.is_dir()


def test_a_length_past_the_cap_is_refused_before_any_payload(tmp_path):
    for got in _run("length", str(tmp_path)):
        assert got["refused"] == [f"rank {ROGUE} announced a payload of {10**12} bytes, outside 0..{1 << 20}"]
