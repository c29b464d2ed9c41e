"""The benchmark's Lightning job: the charlm model and corpus (stalwart.examples.charlm) trained by a
Lightning Trainer with the StalwartCallback, from a StatefulDataLoader (resumable mid-epoch). It
records when this process started (as bench/recovery_worker.py does) and prints charlm's step lines
from rank 0, so bench/bench_inplace.py measures it the same way, under ``stalwart run`` and torchrun.

Run: python bench/lightning_worker.py --steps 45 --checkpoint-every 10 [--corpus-bytes N] [--log-every 1]
"""

from __future__ import annotations

import os
import time

from recovery_worker import SEQ, job_args, record_boot, windows

record_boot()

import lightning as L  # noqa: E402 - after the boot record: the import is part of a restart's cost
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from stalwart.examples.charlm import CharLM  # noqa: E402
from stalwart.integrations.lightning import StalwartCallback  # noqa: E402
from stalwart.integrations.resumable_sampler import ResumableDistributedSampler  # noqa: E402


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
    args = job_args(__doc__.splitlines()[0])
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    data = windows(args.corpus_bytes, args.global_batch * 8)  # 8 steps an epoch
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
