"""The bench's tiny training job: timed sections (own work in "forward", the all-reduce in
"backward"), a checkpoint every 5 steps so a restart resumes. argv: steps [pause=RANK:STEP:SECONDS]:
the optional pause stalls one rank once, inside its forward section, for that many seconds (a stall
shorter than the hang timeout: the bench's "must not be a hang" case)."""

import os
import sys
import time

import torch
import torch.distributed as dist

from stalwart.train import Session

steps = int(sys.argv[1])
pause_rank, pause_step, pause_s = -1, -1, 0.0
if len(sys.argv) > 2 and sys.argv[2].startswith("pause="):
    r, s, sec = sys.argv[2].removeprefix("pause=").split(":")
    pause_rank, pause_step, pause_s = int(r), int(s), float(sec)
session = Session()
session.init_process_group("gloo")
rank = int(os.environ.get("RANK", "0"))
paused = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"  # the stall happens once per run
model = torch.nn.Linear(8, 8)
for step in session.loop(steps, {"model": model}, checkpoint_every=5):
    with session.section("forward"):
        time.sleep(0.03)
        if rank == pause_rank and step == pause_step and not paused:
            time.sleep(pause_s)
        loss = model(torch.ones(4, 8)).sum()
    with session.section("backward"):
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
session.finish()
