"""An epoch/DataLoader trainer as users write them for torchrun: DDP, DistributedSampler, an
LR schedule, a validation pass on rank 0 each epoch, no Stalwart SDK, no checkpoints."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_data(n):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 16, generator=g)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    return TensorDataset(x, y)


def evaluate(model, data):
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        acc = ((model(x) > 0).float() == y).float().mean().item()
    model.train()
    return acc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--eval-seconds", type=float, default=0.0, help="extra time rank 0 spends evaluating")
    parser.add_argument("--out", default="final.pt")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(42)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    train, val = build_data(512), build_data(128)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loss_fn = nn.BCEWithLogitsLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        sched.step()
        if rank == 0:
            acc = evaluate(model.module, val)
            if args.eval_seconds:
                import time

                end = time.time() + args.eval_seconds
                while time.time() < end:  # a long evaluation: busy on rank 0, the others wait
                    evaluate(model.module, val)
            print(
                f"epoch {epoch} loss {loss.item():.4f} val acc {acc:.3f} (local rank {local_rank})",
                flush=True,
            )
        dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
