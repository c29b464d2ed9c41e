"""What a sharded step's commit costs (train/step_commit.py): FSDP2 steps with and without it, same run.

    python bench/bench_step_commit.py --worlds 2,4 --widths 64,1024 --rounds 6 --steps 40

For each world size and model width, ``world`` processes on gloo build an MLP of three
``width x width`` layers under ``fully_shard`` (HSDP with shards of 2 from 4 ranks on, as the e2e
tests run it), take warm-up steps, then alternate rounds of ``--steps`` steps with the commit's
optimizer pre-hook attached and detached. Rank 0 prints the median step time of each arm and the
difference, per size, as one JSON line each and a table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _worker(rank: int, world: int, port: int, width: int, rounds: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from stalwart.train.step_commit import StepCommit

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    shape = (world // 2, 2) if world >= 4 else (world,)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(3)))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, width)
    commit = StepCommit(lambda: False)
    state = {"model": model, "optimizer": opt}

    def step() -> float:
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0

    for _ in range(5):
        step()
    times: dict[str, list[float]] = {"commit": [], "none": []}
    for r in range(rounds):
        arm = "commit" if r % 2 == 0 else "none"
        attached = commit.attach(state) if arm == "commit" else (commit.detach() or False)
        assert attached == (arm == "commit")
        dist.barrier()
        times[arm].extend(step() for _ in range(steps))
    commit.detach()
    if rank == 0:
        Path(out).write_text(json.dumps({k: median(v) for k, v in times.items()}))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    import tempfile

    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--widths", default="64,1024")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds, half with the commit")
    ap.add_argument("--steps", type=int, default=40, help="steps per round")
    args = ap.parse_args()
    rows = []
    for world in (int(w) for w in args.worlds.split(",")):
        for width in (int(w) for w in args.widths.split(",")):
            out = os.path.join(tempfile.mkdtemp(), "times.json")
            mp.start_processes(
                _worker,
                args=(world, _free_port(), width, args.rounds, args.steps, out),
                nprocs=world,
                join=True,
                start_method="spawn",
            )
            got = json.loads(Path(out).read_text())
            row = {
                "world": world,
                "width": width,
                "params": 3 * (width * width + width),
                "step_ms_commit": round(got["commit"] * 1e3, 3),
                "step_ms_none": round(got["none"] * 1e3, 3),
                "added_ms": round((got["commit"] - got["none"]) * 1e3, 3),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| world | params | step, commit | step, none | added |\n|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['world']} | {r['params']:,} | {r['step_ms_commit']} ms | {r['step_ms_none']} ms "
            f"| {r['added_ms']} ms |"
        )


if __name__ == "__main__":
    main()
