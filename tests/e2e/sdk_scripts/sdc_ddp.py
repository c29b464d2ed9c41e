"""A deterministic DDP job (3 ranks, or 2) under ``Session.run`` for the silent-data-corruption e2e: the same
weights on every rank, data drawn from the step number, a fixed reduction order, AdamW. Each rank
writes the sha256 of its final parameters to ``<out>/digest-rank<R>.txt``, so a test compares every
replica with every other and with a run without faults.
argv: steps out_dir."""

import hashlib
import os
import sys
import time

import torch
import torch.nn as nn

from stalwart.train import Session
from stalwart.train.determinism import rank_ordered_allreduce_hook

STEPS = int(sys.argv[1])
OUT = sys.argv[2]


def train(session: Session) -> None:
    session.init_process_group("gloo")
    rank = session.rank
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, rank_ordered_allreduce_hook)  # the same sum on every run
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"model": model, "optimizer": opt}
    for step in session.loop(STEPS, state, checkpoint_every=10):
        g = torch.Generator().manual_seed(step * 97 + rank)
        x = torch.randn(8, 16, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        time.sleep(0.016)
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode() + p.detach().contiguous().numpy().tobytes())
    with open(os.path.join(OUT, f"digest-rank{rank}.txt"), "w") as fh:
        fh.write(digest.hexdigest())
    session.finish()


Session().run(train)
