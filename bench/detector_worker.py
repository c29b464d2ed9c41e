"""The bench's tiny training job: timed sections (own work in "forward", the all-reduce in
"backward"), a checkpoint every 5 steps so a restart resumes. argv: steps."""

import sys
import time

import torch
import torch.distributed as dist

from stalwart.train import Session

steps = int(sys.argv[1])
session = Session()
session.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
for _step in session.loop(steps, {"model": model}, checkpoint_every=5):
    with session.section("forward"):
        time.sleep(0.03)
        loss = model(torch.ones(4, 8)).sum()
    with session.section("backward"):
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
session.finish()
