"""Cost of the silent-data-corruption check (train/replica_check.py) at three model sizes, and the
share of training time it takes at the default interval for 16 ms steps.

    .venv/bin/python bench/sdc_overhead.py [--sizes 1,10,50] [--repeat 5] [--ranks 3]

One check is (1) the exact fingerprint of the state (every parameter and both Adam moments: three
tensors' worth of memory per parameter) and (2) one all_gather of a small int64 vector among the
replicas. (1) is measured in this process for an MLP of each size (millions of parameters); the
baseline, measured in the same run on the same tensors, is a plain float ``sum`` of each (one read
of the same memory). (2) is measured among ``--ranks`` gloo processes on this machine. The interval
is what ``policy.sdc.check_interval`` picks for a 1% budget; the overhead is the check's cost over
that many 16 ms steps. Best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stalwart.policy.sdc import check_interval
from stalwart.train.fingerprint import exact
from stalwart.train.replica_check import state_tensors

STEP_S = 0.016
BUDGET = 0.01


def model_state(millions: int) -> dict:
    width = 1024
    layers = max(1, round(millions * 1e6 / (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters())
    for p in model.parameters():  # the moments exist after the first step
        opt.state[p] = {"exp_avg": torch.randn_like(p), "exp_avg_sq": torch.rand_like(p)}
    return {"model": model, "optimizer": opt}


def best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _gather_worker(rank: int, world: int, port: int, n: int, repeat: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    vec = torch.arange(n + 1, dtype=torch.int64)
    bufs = [torch.empty_like(vec) for _ in range(world)]
    times = []
    for _ in range(repeat * 20):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather(bufs, vec)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(sorted(times)[len(times) // 2])  # the median: one slow scheduling is not the cost
    dist.destroy_process_group()


def gather_s(world: int, n: int, repeat: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.start_processes(_gather_worker, args=(world, port, n, repeat, q), nprocs=world, start_method="spawn")
    return float(q.get())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,10,50", help="model sizes, millions of parameters")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)  # a trainer's other cores are busy; one core is the honest figure
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 thread, best of {args.repeat}")
    rows = []
    for m in (int(x) for x in args.sizes.split(",")):
        state = model_state(m)
        tensors = [t for _, t in state_tensors(state)]
        params = sum(p.numel() for p in state["model"].parameters())
        fp = best(lambda tensors=tensors: exact(tensors), args.repeat)
        base = best(lambda tensors=tensors: [t.sum() for t in tensors], args.repeat)
        g = gather_s(args.ranks, len(tensors), args.repeat)
        check = fp + g
        n = check_interval(check, STEP_S, BUDGET)
        rows.append((params, len(tensors), fp, base, g, check, n, check / (n * STEP_S)))
        del state, tensors
    print(
        "| parameters | state tensors | fingerprint ms | float sum ms (baseline) | x baseline "
        "| all_gather ms | check ms | interval at 16 ms steps | overhead |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for params, k, fp, base, g, check, n, share in rows:
        print(
            f"| {params / 1e6:.1f} M | {k} | {fp * 1e3:.2f} | {base * 1e3:.2f} | {fp / base:.2f} "
            f"| {g * 1e3:.3f} | {check * 1e3:.2f} | {n} | {share:.2%} |"
        )


if __name__ == "__main__":
    main()
