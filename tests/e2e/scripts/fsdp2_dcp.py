"""An FSDP2 job as users write it for torchrun, no Stalwart import: ``fully_shard`` over a CPU mesh
(gloo), AdamW, and its own Distributed Checkpoint (DCP) every ``--save-every`` steps, loaded from the
newest one on start. Each batch comes from a data service that answers in ``--data-s``.

    torchrun --nproc-per-node 2 fsdp2_dcp.py --steps 30      # or: stalwart run ... fsdp2_dcp.py
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, 2 * d), nn.Linear(2 * d, 2 * d), nn.Linear(2 * d, 8)])

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


def build(world):
    """The sharded model and its optimizer."""
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    torch.manual_seed(0)
    model = Net()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def batch(step, rank, delay=0.0):
    time.sleep(delay)  # the data service's latency
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 64, generator=g)
    return x, x[:, :8].cos()


def newest(ckpt_dir):
    steps = (
        [int(n.split("_")[1]) for n in os.listdir(ckpt_dir) if n.startswith("step_")]
        if os.path.isdir(ckpt_dir)
        else []
    )
    return max(steps, default=0)


def load(ckpt_dir, model, opt):
    """Every rank loads its shards of the newest checkpoint; the step to resume at (0: none)."""
    step = newest(ckpt_dir)
    if step:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=os.path.join(ckpt_dir, f"step_{step}"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        print(f"rank {dist.get_rank()} resumed from its checkpoint at step {step}", flush=True)
    return step


def save(ckpt_dir, model, opt, step):
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(ckpt_dir, f"step_{step}"))


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--ckpt-dir", default="dcp")
    ap.add_argument("--data-s", type=float, default=0.0)
    return ap.parse_args()


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model, opt = build(world)
    for step in range(load(args.ckpt_dir, model, opt), args.steps):
        x, y = batch(step, rank, args.data_s)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % args.save_every == 0:
            save(args.ckpt_dir, model, opt, step + 1)
            if rank == 0:
                print(f"step {step + 1} loss {loss.item():.4f}: checkpoint saved", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
