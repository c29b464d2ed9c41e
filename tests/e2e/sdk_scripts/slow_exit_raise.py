"""A script whose rank 1 raises at step 3 and then takes seconds to exit (an atexit handler that
flushes slowly, as on a loaded machine): the exception must be classified as one, not as a hang."""

import atexit
import time

import torch

from stalwart.train import Session

session = Session()
session.init_process_group("gloo")
model = torch.nn.Linear(4, 4)
for step in session.loop(8, {"model": model}):
    if step == 3 and session.rank == 1:
        atexit.register(time.sleep, 6.0)
        raise ValueError("bad batch at step 3")
    time.sleep(0.05)
session.finish()
