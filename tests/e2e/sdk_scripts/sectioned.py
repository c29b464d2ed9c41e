"""A tiny data-parallel loop with timed sections: own work in "forward", the all-reduce in "backward"
(the straggler detector compares own work). argv: steps, optionally a rank that raises the NCCL
watchdog's timeout error at step 3 ("all": every rank), and optionally a file: rank 0 of every
attempt appends "<restart count> <NCCL_IB_HCA or ->" to it, and the error is raised in attempt 0 only."""

import os
import sys
import time

import torch
import torch.distributed as dist

from stalwart.train import Session

steps = int(sys.argv[1])
fail = sys.argv[2] if len(sys.argv) > 2 else ""
seen = sys.argv[3] if len(sys.argv) > 3 else ""
session = Session()
session.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if seen:
    if session.rank == 0:
        with open(seen, "a") as f:
            f.write(f"{attempt} {os.environ.get('NCCL_IB_HCA', '-')}\n")
    if attempt > 0:
        fail = ""
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
