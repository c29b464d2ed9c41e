"""The benchmark's training process: record when this process started, then run the example job.
The framework jobs (bench/lightning_worker.py, bench/hf_worker.py) record their start the same way,
and train on the same corpus windows (:class:`Windows`)."""

import argparse
import json
import os
from pathlib import Path

from stalwart.process_clock import process_start

SEQ = 64


def record_boot() -> None:
    """When this process started, for the benchmark (``BENCH_BOOT_DIR``); call before heavy imports."""
    boot_dir = os.environ.get("BENCH_BOOT_DIR")
    if boot_dir:
        record = {"rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(), "start": process_start()}
        (Path(boot_dir) / f"boot-{os.getpid()}.json").write_text(json.dumps(record))


def job_args(description: str) -> argparse.Namespace:
    """The framework jobs' flags: those bench/bench_inplace.py passes to every job."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=45)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--corpus-bytes", type=int, default=300_000)
    ap.add_argument("--log-every", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=32)
    return ap.parse_args()


def windows(corpus_bytes: int, n: int):  # noqa: ANN201 - a torch Dataset, torch imported here (heavy)
    """charlm's corpus as ``n`` fixed windows of SEQ bytes (starts drawn once from a seeded generator):
    sample i is (input, target), the target shifted by one byte."""
    import torch  # deferred: after the boot record

    from stalwart.examples.charlm import load_corpus

    class Windows(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.corpus = load_corpus(corpus_bytes)
            g = torch.Generator().manual_seed(7)
            self.starts = torch.randint(0, len(self.corpus) - SEQ - 1, (n,), generator=g)

        def __len__(self) -> int:
            return len(self.starts)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            s = int(self.starts[i])
            return self.corpus[s : s + SEQ], self.corpus[s + 1 : s + SEQ + 1]

    return Windows()


if __name__ == "__main__":
    record_boot()
    from stalwart.examples.charlm import main

    main()
