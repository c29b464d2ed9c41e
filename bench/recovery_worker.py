"""The benchmark's training process: record when this process started, then run the example job."""

import json
import os
from pathlib import Path

from stalwart.process_clock import process_start

boot_dir = os.environ.get("BENCH_BOOT_DIR")
if boot_dir:
    record = {"rank": int(os.environ.get("RANK", "0")), "pid": os.getpid(), "start": process_start()}
    (Path(boot_dir) / f"boot-{os.getpid()}.json").write_text(json.dumps(record))

if __name__ == "__main__":
    from stalwart.examples.charlm import main

    main()
