"""A healthy low-CPU DDP job as users write them for torchrun, no Stalwart import: each step a rank
waits (``--idle`` s, like a slow data service or an RL rollout), then one small all-reduce and an
optimizer step; ``--io-rank`` also waits ``--io-wait`` s on "I/O" every ``--io-every`` steps. Its own
SIGTERM/SIGUSR1 handler writes ``<flag>.<rank>`` and either lets the loop finish (``--on-signal
finish``) or saves a snapshot and dies of the signal (``--on-signal die``)."""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--idle", type=float, default=0.5)
    parser.add_argument("--io-rank", type=int, default=-1)
    parser.add_argument("--io-wait", type=float, default=0.0)
    parser.add_argument("--io-every", type=int, default=3)
    parser.add_argument("--flag", default="")
    parser.add_argument("--on-signal", choices=("finish", "die"), default="finish")
    parser.add_argument("--no-optimizer", action="store_true", help="collectives only")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    got = []

    def on_signal(signum, frame):
        got.append(signum)
        if args.flag:
            with open(f"{args.flag}.{rank}", "w") as fh:
                fh.write(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"rank {rank} ready", flush=True)
    for step in range(args.steps):
        if got and args.on_signal == "die":
            torch.save(model.state_dict(), f"snapshot.{rank}.pt")
            signal.signal(got[0], signal.SIG_DFL)
            os.kill(os.getpid(), got[0])
        time.sleep(args.idle)
        if rank == args.io_rank and args.io_wait and step % args.io_every == 1:
            time.sleep(args.io_wait)
        t = torch.ones(4)
        dist.all_reduce(t)
        if not args.no_optimizer:
            opt.zero_grad()
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
        print(f"rank {rank} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
