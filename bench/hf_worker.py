"""The benchmark's Hugging Face ``Trainer`` job: a GPT-2 of charlm's size (d 64, 2 layers, 4 heads,
sequence 64, bytes as tokens) on charlm's corpus, with the StalwartCallback. It records when this
process started (as bench/recovery_worker.py does) and prints charlm's step lines from rank 0, so
bench/bench_inplace.py measures it the same way, under ``stalwart run`` and torchrun.

Run: python bench/hf_worker.py --steps 45 --checkpoint-every 10 [--corpus-bytes N] [--log-every 1]
"""

from __future__ import annotations

import os
import time

from recovery_worker import SEQ, job_args, record_boot, windows

record_boot()

import torch  # noqa: E402 - after the boot record: the imports are part of a restart's cost
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from stalwart.integrations.hf import StalwartCallback  # noqa: E402
from stalwart.protocol import WorkerEnv  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    """charlm's corpus windows as the Trainer takes them (bytes as tokens, the labels shifted by the model)."""

    def __init__(self, corpus_bytes: int, n: int) -> None:
        self.windows = windows(corpus_bytes, n)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.windows[i][0]
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
    args = job_args(__doc__.splitlines()[0])
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
    data = Tokens(args.corpus_bytes, args.global_batch * 8)
    trainer = Trainer(
        model=model, args=targs, train_dataset=data, callbacks=[cb, StepLines(args.steps, args.log_every)]
    )
    trainer.train(resume_from_checkpoint=cb.resume_path(out))


if __name__ == "__main__":
    main()
