"""The SDK twin of ``fsdp2_dcp.py``: the same model, data, steps and DCP checkpoints, its steps and
sections reported by ``stalwart.train.Session`` instead of the bootstrap's optimizer hooks (the
acceptance test compares the two runs' reports)."""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsdp2_dcp import batch, build, load, parse, save  # noqa: E402

from stalwart.train import Session  # noqa: E402


def main():
    args = parse()
    session = Session()
    session.init_process_group("gloo")
    rank, world = session.rank, session.world_size
    torch.set_num_threads(1)
    model, opt = build(world)
    start = load(args.ckpt_dir, model, opt)
    for step in session.loop(args.steps, {}, resume=False):
        if step < start:
            continue
        with session.section("data"):
            x, y = batch(step, rank, args.data_s)
        with session.section("forward"):  # the shards' all-gather is in here
            loss = F.mse_loss(model(x), y)
        with session.section("backward"):  # the gradients' reduce-scatter
            opt.zero_grad()
            loss.backward()
        with session.section("optimizer"):
            opt.step()
        if (step + 1) % args.save_every == 0:
            save(args.ckpt_dir, model, opt, step + 1)
            if rank == 0:
                print(f"step {step + 1} loss {loss.item():.4f}: checkpoint saved", flush=True)
    session.finish()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
