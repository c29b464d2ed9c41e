"""A plain torchrun-style FSDP2 training script that uses the Stalwart SDK, as a user writes it.

    torchrun --nproc-per-node 4 fsdp_train.py --steps 20            # or: stalwart run ... fsdp_train.py
    --mesh 2x2                                                      # HSDP: replicate x shard
    --mesh x2                                                       # HSDP: shards of 2, replicas fill the world
    --in-place                                                      # under Session.run

Data comes from torchdata's StatefulDataLoader over Stalwart's ElasticDistributedSampler; the SDK
checkpoints model, optimizer, LR schedule, data position and RNGs on every rank. Test hooks:
``--log-dir`` (every consumed sample id), ``--exit-at``/``--sigterm-at`` (faults on every rank),
``--dump-at-start`` and ``--out`` (the full model and optimizer state, written by rank 0),
``--stop-file`` (once that file exists, written whole, every rank ends its loop at the step it names).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader

from stalwart.train import Session
from stalwart.train.data import ElasticDistributedSampler


class Tiny(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, 2 * d), nn.Linear(2 * d, 2 * d), nn.Linear(2 * d, 4)])
        self.drop = nn.Dropout(0.1)  # draws from the torch RNG: exact resume needs it restored

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = self.drop(torch.tanh(layer(x)))
        return self.layers[-1](x)


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 4, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


def full_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Collective: the whole model and optimizer state (unsharded), on CPU."""
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optimizer": osd}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument(
        "--mesh", default="", help="'N' (FSDP over N ranks), 'RxS' or 'xS' (HSDP); default: world size"
    )
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4, help="per rank")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--log-dir", default="")
    ap.add_argument("--exit-at", type=int, default=-1)
    ap.add_argument("--sigterm-at", type=int, default=-1)
    ap.add_argument("--dump-at-start", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--stop-file", default="")
    ap.add_argument("--in-place", action="store_true", help="run under Session.run (in-place recovery)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    session = Session(checkpoint_dir=args.checkpoint_dir)
    if args.in_place:  # a failed rank is replaced in place: train() runs again on the re-formed group
        session.run(lambda s: train(s, args))
    else:
        train(session, args)


def train(session: Session, args: argparse.Namespace) -> None:
    session.init_process_group("gloo")
    rank, world = session.rank, session.world_size
    if args.mesh.startswith("x"):  # shards of S, as many replica groups as the world holds
        shape: tuple[int, ...] = (world // int(args.mesh[1:]), int(args.mesh[1:]))
    else:
        shape = tuple(int(x) for x in args.mesh.split("x")) if args.mesh else (world,)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)

    torch.manual_seed(args.seed)
    model = Tiny()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch.manual_seed(args.seed + 1 + rank)  # per-rank dropout stream
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.05 * s))
    sampler = ElasticDistributedSampler(args.samples, rank=rank, world_size=world, seed=args.seed)
    # its own generator: creating an iterator draws a base seed from it, not from the global RNG
    # (which drives dropout and is restored exactly on resume)
    loader = StatefulDataLoader(
        Synthetic(args.samples, args.seed),
        batch_size=args.batch,
        sampler=sampler,
        generator=torch.Generator().manual_seed(args.seed),
    )
    state = {"model": model, "optimizer": opt, "scheduler": sched, "data": loader}

    log = None
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        log = open(Path(args.log_dir) / f"a{session.attempt}-r{rank}-p{os.getpid()}.jsonl", "a")  # noqa: SIM115
    it = None
    for step in session.loop(args.steps, state, checkpoint_every=args.checkpoint_every):
        if (
            args.stop_file
            and os.path.exists(args.stop_file)
            and step >= int(Path(args.stop_file).read_text())
        ):
            break
        if it is None:
            if args.dump_at_start:
                full = full_state(model, opt)
                if rank == 0:
                    torch.save(full, args.dump_at_start)
            it = iter(loader)
        with session.section("data"):
            try:
                ids, x, y = next(it)
            except StopIteration:  # next epoch
                sampler.set_epoch(sampler.epoch + 1)
                it = iter(loader)
                ids, x, y = next(it)
        if log is not None:
            log.write(
                json.dumps(
                    {
                        "t": time.time(),
                        "step": step,
                        "rank": rank,
                        "world": world,
                        "epoch": sampler.epoch,
                        "ids": ids.tolist(),
                    }
                )
                + "\n"
            )
            log.flush()
        if step == args.exit_at:  # a crash in the middle of the step on every rank, once the last
            session.checkpointer.wait()  # checkpoint is durable (so the test knows where it resumes)
            os._exit(1)
        if step == args.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice: stop after this step
        with session.section("forward"):
            loss = F.mse_loss(model(x), y)
        with session.section("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with session.section("optimizer"):
            opt.step()
            sched.step()
    if args.out:
        full = full_state(model, opt)
        if rank == 0:
            torch.save(full, args.out)
    session.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
