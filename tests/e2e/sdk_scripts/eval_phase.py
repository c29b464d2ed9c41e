"""A small SDK trainer whose rank 0 evaluates inside the loop, marked as a phase, and may spend a while
after the loop on work of its own, unmarked (as a script saving its model would)."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from stalwart.train import Session

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--eval-at", type=int, default=15)
parser.add_argument("--eval-seconds", type=float, default=6.0)
parser.add_argument("--budget", type=float, default=30.0)
parser.add_argument("--hang-in-eval", action="store_true")
parser.add_argument("--after-loop-seconds", type=float, default=0.0)
args = parser.parse_args()

session = Session()
session.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in session.loop(args.steps, {"model": model, "optimizer": opt}, checkpoint_every=0):
    with session.section("forward"):
        loss = torch.nn.functional.mse_loss(model(x), y)
    with session.section("backward"):
        loss.backward()
    with session.section("optimizer"):
        opt.step()
        opt.zero_grad()
    time.sleep(0.05)
    if step == args.eval_at and dist.get_rank() == 0:
        with session.phase("eval", budget_s=args.budget):
            end = time.time() + args.eval_seconds
            while args.hang_in_eval or time.time() < end:
                time.sleep(0.1)
if dist.get_rank() == 0:
    time.sleep(args.after_loop_seconds)  # e.g. torch.save of the whole model, after the last step
session.finish()
dist.destroy_process_group()
