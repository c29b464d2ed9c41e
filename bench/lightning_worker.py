"""The benchmark's Lightning job: the charlm model and corpus (stalwart.examples.charlm) trained by a
Lightning Trainer with the StalwartCallback, from a StatefulDataLoader (resumable mid-epoch). It
records when this process started (as bench/recovery_worker.py does) and prints charlm's step lines
from rank 0, so bench/bench_inplace.py measures it the same way, under ``stalwart run`` and torchrun.

Run: python bench/lightning_worker.py --steps 45 --checkpoint-every 10 [--corpus-bytes N] [--log-every 1]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from stalwart.process_clock import process_start

boot_dir = os.environ.get("BENCH_BOOT_DIR")
if boot_dir:
    record = {"rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(), "start": process_start()}
    (Path(boot_dir) / f"boot-{os.getpid()}.json").write_text(json.dumps(record))

import lightning as L  # noqa: E402 - after the boot record: the import is part of a restart's cost
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from stalwart.examples.charlm import CharLM, load_corpus  # noqa: E402
from stalwart.integrations.lightning import StalwartCallback  # noqa: E402
from stalwart.integrations.resumable_sampler import ResumableDistributedSampler  # noqa: E402

SEQ = 64


class Windows(Dataset):
    """Sample i: a fixed window of the corpus (its start drawn once from a seeded generator)."""

    def __init__(self, corpus: torch.Tensor, n: int) -> None:
        self.corpus = corpus
        self.starts = torch.randint(
            0, len(corpus) - SEQ - 1, (n,), generator=torch.Generator().manual_seed(7)
        )

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = int(self.starts[i])
        return self.corpus[s : s + SEQ], self.corpus[s + 1 : s + SEQ + 1]


class LM(L.LightningModule):
    def __init__(self, steps: int) -> None:
        super().__init__()
        torch.manual_seed(1234)  # identical initial weights on every rank
        self.net = CharLM(seq=SEQ)
        self.steps = steps

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x).reshape(-1, 256), y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01)


class StepLines(L.Callback):
    """charlm's step line on rank 0 after every ``every`` optimizer steps (the bench parses them)."""

    def __init__(self, total: int, every: int) -> None:
        self.total, self.every = total, every

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, idx: int
    ) -> None:
        step = trainer.global_step
        if trainer.is_global_zero and self.every and step % self.every == 0:
            loss = float(outputs["loss"]) if isinstance(outputs, dict) else float("nan")
            print(f"step {step}/{self.total} loss {loss:.4f} t {time.time():.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--corpus-bytes", type=int, default=300_000)
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=32)
    args = ap.parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    data = Windows(load_corpus(args.corpus_bytes), args.global_batch * 8)  # 8 steps an epoch
    sampler = ResumableDistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = StatefulDataLoader(data, batch_size=args.global_batch // world, sampler=sampler)
    cb = StalwartCallback(checkpoint_every=args.checkpoint_every)
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        callbacks=[cb, StepLines(args.steps, args.log_every)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    trainer.fit(LM(args.steps), loader, ckpt_path=cb.resume_path())


if __name__ == "__main__":
    main()
