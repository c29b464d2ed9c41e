"""A plain DDP step loop as users write it for torchrun, no Stalwart import: gloo, a
DistributedSampler, ``torch.save`` of model and optimizer every ``--save-every`` steps (rank 0 writes,
every rank loads it on start and resumes after its step). ``--raise-at`` raises a user error at that
step on rank 0; ``--flip-at`` flips one exponent bit of a weight on rank 1 after that step, once per
run (silent data corruption, as a faulty GPU would). After each save it touches ``saved-<step>`` beside the checkpoint, so a test can
act just after a given checkpoint.

    torchrun --nproc-per-node 2 ddp_steps.py --steps 60     # or: stalwart run ... ddp_steps.py
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--ckpt", default="ckpt.pt")
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--raise-at", type=int, default=-1)
    ap.add_argument("--flip-at", type=int, default=-1)  # rank 1 flips a weight's exponent bit after it, once
    return ap.parse_args()


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if os.path.exists(args.ckpt):
        snap = torch.load(args.ckpt, map_location="cpu", weights_only=True)
        model.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        start = snap["step"]
        print(f"rank {rank} resuming at step {start}", flush=True)
    ddp = DDP(model)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 16, generator=g)
    data = TensorDataset(x, x[:, :3].sum(dim=1, keepdim=True))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=2)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    batches = iter(loader)
    for step in range(start, args.steps):
        xb, yb = next(batches)
        if step == args.raise_at and rank == 0:
            raise ValueError(f"bad batch at step {step}")
        opt.zero_grad()
        F.mse_loss(ddp(xb), yb).backward()
        opt.step()
        if step == args.flip_at and rank == 1 and not os.path.exists("flipped"):
            open("flipped", "w").close()  # silent data corruption, once per run: a weight halves or doubles
            with torch.no_grad():
                model[0].weight.view(-1)[3:4].view(torch.int32).bitwise_xor_(1 << 23)
        time.sleep(args.step_s)
        if (step + 1) % args.save_every == 0:
            if rank == 0:
                tmp = args.ckpt + ".tmp"
                torch.save(
                    {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, tmp
                )
                os.replace(tmp, args.ckpt)
                open(f"saved-{step + 1}", "w").close()
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
