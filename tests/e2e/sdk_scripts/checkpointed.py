"""A tiny data-parallel loop with timed sections (own work in "forward", the all-reduce in
"backward") and a checkpoint every 10 steps, so a job that loses a node resumes at the smaller size.
argv: steps."""

import sys
import time

import torch
import torch.distributed as dist

from stalwart.train import Session

steps = int(sys.argv[1])
session = Session()
session.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
for _step in session.loop(steps, {"model": model}, checkpoint_every=10):
    with session.section("forward"):
        time.sleep(0.03)
        loss = model(torch.ones(4, 8)).sum()
    with session.section("backward"):
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
session.finish()
