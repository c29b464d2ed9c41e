"""A DDP epochs loop as users write it for torchrun, no Stalwart import: a DataLoader with a worker
process over a DistributedSampler, and its own ``torch.save`` snapshot each epoch (rank 0 writes it,
every rank loads it on start). ``--slow-rank``'s data loader takes ``--slow-s`` per batch (slow
storage on one node): that rank is the job's straggler, its peers wait for it in the all-reduce.

    torchrun --nproc-per-node 2 ddp_epochs.py --epochs 2      # or: stalwart run ... ddp_epochs.py
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Samples(Dataset):
    def __init__(self, n, delay):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = self.x[:, :4].sum(dim=1, keepdim=True)
        self.delay = delay

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def collate(self, batch):  # runs in the loader's worker process
        if self.delay:
            time.sleep(self.delay)
        return torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])


def build(args, rank, world):
    """Model, optimizer, data loader and sampler, and the epoch to start from (the snapshot's)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, map_location="cpu", weights_only=True)
        model.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        start = snap["epochs_run"]
        print(f"rank {rank} resuming from its snapshot at epoch {start}", flush=True)
    data = Samples(args.samples, args.slow_s if rank == args.slow_rank else 0.0)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=1, collate_fn=data.collate)
    return DDP(model), opt, loader, sampler, start


def save_snapshot(path, model, opt, epochs_run):
    tmp = path + ".tmp"
    torch.save(
        {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epochs_run": epochs_run}, tmp
    )
    os.replace(tmp, path)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=640)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--snapshot", default="snapshot.pt")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-s", type=float, default=0.0)
    return ap.parse_args()


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model, opt, loader, sampler, start = build(args, rank, world)
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        if rank == 0:
            save_snapshot(args.snapshot, model, opt, epoch + 1)
            print(f"epoch {epoch} loss {loss.item():.4f}: snapshot saved", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
