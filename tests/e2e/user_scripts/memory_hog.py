"""A worker without the SDK. Rank 1 writes its PID to $HOG_PID_DIR, joins the memory cgroup named by
$HOG_CGROUP_PROCS (when set) and allocates until the kernel's OOM killer ends it; without a cgroup
it waits to be killed. Every other rank waits for the agent to stop it."""

import os
import time
from pathlib import Path

rank = int(os.environ["RANK"])
if rank == 1:
    Path(os.environ["HOG_PID_DIR"], "rank1.pid").write_text(str(os.getpid()))
    procs = os.environ.get("HOG_CGROUP_PROCS")
    if procs:
        Path(procs).write_text(str(os.getpid()))
        hoard = []
        while True:
            hoard.append(bytearray(16 * 1024 * 1024))  # touched: bytearray zero-fills its pages
            time.sleep(0.01)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.1)
