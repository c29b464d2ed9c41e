"""The benchmark's Hugging Face ``Trainer`` job: a GPT-2 of charlm's size (d 64, 2 layers, 4 heads,
sequence 64, bytes as tokens) on charlm's corpus, with the StalwartCallback. It records when this
process started (as bench/recovery_worker.py does) and prints charlm's step lines from rank 0, so
bench/bench_inplace.py measures it the same way, under ``stalwart run`` and torchrun.

Run: python bench/hf_worker.py --steps 45 --checkpoint-every 10 [--corpus-bytes N] [--log-every 1]
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

import torch  # noqa: E402 - after the boot record: the imports are part of a restart's cost
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from stalwart.examples.charlm import load_corpus  # noqa: E402
from stalwart.integrations.hf import StalwartCallback  # noqa: E402
from stalwart.protocol import WorkerEnv  # noqa: E402

SEQ = 64


class Windows(torch.utils.data.Dataset):
    """Sample i: a fixed window of the corpus (its start drawn once from a seeded generator)."""

    def __init__(self, corpus: torch.Tensor, n: int) -> None:
        self.corpus = corpus
        self.starts = torch.randint(
            0, len(corpus) - SEQ - 1, (n,), generator=torch.Generator().manual_seed(7)
        )

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        s = int(self.starts[i])
        ids = self.corpus[s : s + SEQ]
        return {"input_ids": ids, "labels": ids}


class StepLines(TrainerCallback):
    """charlm's step line on rank 0 after every ``every`` optimizer steps (the bench parses them)."""

    def __init__(self, total: int, every: int) -> None:
        self.total, self.every = total, every

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 - the Trainer's hook
        if state.is_world_process_zero and self.every and state.global_step % self.every == 0:
            print(
                f"step {state.global_step}/{self.total} epoch {state.epoch or 0:.2f} t {time.time():.3f}",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--corpus-bytes", type=int, default=300_000)
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=32)
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    worker = WorkerEnv.from_env(os.environ)
    out = os.environ.get("BENCH_HF_OUT") or os.path.join(worker.run_dir if worker else ".", "hf")
    torch.manual_seed(1234)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4))
    targs = TrainingArguments(
        output_dir=out,
        max_steps=args.steps,
        per_device_train_batch_size=args.global_batch // world,
        learning_rate=3e-3,
        save_strategy="steps",
        save_steps=args.checkpoint_every,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    cb = StalwartCallback()
    data = Windows(load_corpus(args.corpus_bytes), args.global_batch * 8)
    trainer = Trainer(
        model=model, args=targs, train_dataset=data, callbacks=[cb, StepLines(args.steps, args.log_every)]
    )
    trainer.train(resume_from_checkpoint=cb.resume_path(out))


if __name__ == "__main__":
    main()
