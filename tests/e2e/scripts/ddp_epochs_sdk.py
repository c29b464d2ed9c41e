"""The SDK twin of ``ddp_epochs.py``: the same model, data, steps and snapshot, its steps and
sections reported by ``stalwart.train.Session`` instead of the bootstrap's optimizer hooks (the
acceptance test compares the two runs' reports)."""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ddp_epochs import build, parse, save_snapshot  # noqa: E402

from stalwart.train import Session  # noqa: E402


def main():
    args = parse()
    session = Session()
    session.init_process_group("gloo")
    rank, world = session.rank, session.world_size
    torch.set_num_threads(1)
    model, opt, loader, sampler, start = build(args, rank, world)
    per_epoch = len(loader)
    it = None
    for step in session.loop(args.epochs * per_epoch, {}, resume=False):
        epoch, i = divmod(step, per_epoch)
        if epoch < start:
            continue
        if i == 0:
            sampler.set_epoch(epoch)
            it = iter(loader)
        with session.section("data"):
            x, y = next(it)
        with session.section("forward"):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
        with session.section("backward"):  # the gradient all-reduce: a peer's wait for the slow rank
            loss.backward()
        with session.section("optimizer"):
            opt.step()
        if i == per_epoch - 1:
            it = None  # the epoch is over: its loader worker stops here, as the plain loop's does
            if rank == 0:
                save_snapshot(args.snapshot, model, opt, epoch + 1)
                print(f"epoch {epoch} loss {loss.item():.4f}: snapshot saved", flush=True)
    session.finish()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
