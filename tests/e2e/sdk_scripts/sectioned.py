"""A tiny data-parallel loop with timed sections: own work in "forward", the all-reduce in "backward"
(the straggler detector compares own work). argv: steps, and optionally a rank that raises the
NCCL watchdog's timeout error at step 3 ("all": every rank)."""

import sys
import time

import torch
import torch.distributed as dist

from stalwart.train import Session

steps = int(sys.argv[1])
fail = sys.argv[2] if len(sys.argv) > 2 else ""
session = Session()
session.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
for step in session.loop(steps, {"model": model}):
    if step == 3 and fail in ("all", str(session.rank)):
        raise dist.DistBackendError(
            f"[Rank {session.rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
            "OpType=ALLREDUCE, NumelIn=64) ran for 600000 milliseconds before timing out."
        )
    with session.section("forward"):
        time.sleep(0.03)
        loss = model(torch.ones(4, 8)).sum()
    with session.section("backward"):
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
session.finish()
