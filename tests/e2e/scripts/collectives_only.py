"""A job without an optimizer, as users write them for torchrun, no Stalwart import: distributed
evaluation. Each round every rank waits ``--wait-s`` for its shard (a slow data service: the process
sleeps, no CPU), scores it, and the scores meet in an ``all_gather``; rank 0 writes the total."""

import argparse
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--wait-s", type=float, default=1.0)
    ap.add_argument("--out", default="scores.txt")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 1)
    total = 0.0
    for r in range(args.rounds):
        time.sleep(args.wait_s)
        with torch.no_grad():
            score = model(torch.randn(32, 16)).mean().reshape(1)
        gathered = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(gathered, score)
        total += float(sum(gathered))
        if rank == 0:
            print(f"round {r} total {total:.4f}", flush=True)
    if rank == 0:
        with open(args.out, "w") as fh:
            fh.write(f"{args.rounds} {total:.6f}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
