"""A small byte-level transformer language model trained with DDP on gloo.

The corpus is the Python standard library's own source (present on every machine with Python).
Batches are a pure function of (seed, step, sample index), so the data position is the step
counter, and a resumed run sees exactly the batches an uninterrupted one would. The global batch
is split across ranks, so the run can continue at a smaller world size after losing a node.

Run it under the agent:  stalwart run --nproc-per-node 4 -m stalwart.examples.charlm --steps 200
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from stalwart.train import Session
from stalwart.train.determinism import rank_ordered_allreduce_hook


def load_corpus(max_bytes: int) -> torch.Tensor:
    root = Path(sysconfig.get_paths()["stdlib"])
    buf = bytearray()
    for f in sorted(root.glob("*.py")):
        buf += f.read_bytes()
        if len(buf) >= max_bytes:
            break
    if len(buf) < 1024:
        raise SystemExit(f"standard library source not found under {root}")
    return torch.frombuffer(bytearray(buf[:max_bytes]), dtype=torch.uint8).long()


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharLM(nn.Module):
    def __init__(
        self, d: int = 64, layers: int = 2, heads: int = 4, seq: int = 64, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def batch_for(
    corpus: torch.Tensor, step: int, rank: int, world: int, global_batch: int, seq: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of the global batch of ``step``: samples rank, rank+world, ..."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(corpus) - seq - 1, (global_batch,), generator=g)[rank::world]
    x = torch.stack([corpus[s : s + seq] for s in starts.tolist()])
    y = torch.stack([corpus[s + 1 : s + seq + 1] for s in starts.tolist()])
    return x, y


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument(
        "--checkpoint-every", type=lambda v: v if v == "auto" else int(v), default=25, help="N steps, or auto"
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--corpus-bytes", type=int, default=2_000_000)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--out", type=str, default="", help="save the final model state_dict here (rank 0)")
    ap.add_argument(
        "--idiom",
        choices=("run", "loop", "own"),
        default="run",
        help="run: train under Session.run (in-place recovery); loop: call train directly, the plain loop "
        "idiom; own: the same with the script's own loop (session.track)",
    )
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    session = Session()
    if args.idiom in (
        "loop",
        "own",
    ):  # a peer's failure ends this process; the restart takes the state it left
        train(session, args)
        return
    # under Session.run a failed peer is replaced in place: this process stays, train() runs again on
    # the re-formed group and continues from the live state of the last completed step
    session.run(lambda s: train(s, args))


def train(session: Session, args: argparse.Namespace) -> None:
    session.init_process_group("gloo")
    rank, world = session.rank, session.world_size
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by world size {world}")

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = CharLM(args.d_model, args.layers, args.heads, args.seq)
    torch.manual_seed(args.seed + 1 + rank)  # per-rank dropout stream
    ddp: nn.Module = model
    if dist.is_initialized():
        wrapped = nn.parallel.DistributedDataParallel(model)
        # exact resume: the reduction must not depend on DDP's (rebuilt) bucket layout
        wrapped.register_comm_hook(None, rank_ordered_allreduce_hook)
        ddp = wrapped
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    corpus = load_corpus(args.corpus_bytes)
    state = {"model": model, "optimizer": opt, "scheduler": sched}

    def one_step(step: int) -> None:
        with session.section("data"):
            x, y = batch_for(corpus, step, rank, world, args.global_batch, args.seq, args.seed)
        with session.section("forward"):
            logits = ddp(x)
            loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        with session.section("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with session.section("optimizer"):
            opt.step()
            sched.step()
        if rank == 0 and args.log_every and (step + 1) % args.log_every == 0:
            print(
                f"step {step + 1}/{args.steps} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e} "
                f"t {time.time():.3f}",
                flush=True,
            )

    if args.idiom == "own":  # the script keeps its own loop and says where each step ends
        with session.track(state, total_steps=args.steps, checkpoint_every=args.checkpoint_every) as steps:
            for step in range(steps.start, args.steps):
                one_step(step)
                steps.done()
    else:
        for step in session.loop(args.steps, state, checkpoint_every=args.checkpoint_every):
            one_step(step)

    if rank == 0 and args.out:
        torch.save(model.state_dict(), args.out)
    session.finish()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
