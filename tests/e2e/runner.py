"""Run the real ``stalwart`` CLI in a subprocess and read what it left behind."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from stalwart.ledger import read_merged

EXAMPLE = ["-m", "stalwart.examples.charlm", "--corpus-bytes", "300000", "--log-every", "0"]


@dataclass
class Result:
    code: int
    out: str
    err: str
    wall: float


def stalwart(*args: str, timeout: float = 600, cwd: Path | None = None) -> Result:
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, "-m", "stalwart.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    return Result(p.returncode, p.stdout, p.stderr, time.time() - t0)


def events(run_dir: Path, kind: type | None = None) -> list:
    evs = read_merged(run_dir)
    return [e for e in evs if kind is None or isinstance(e, kind)]


def same_params(a: Path, b: Path) -> bool:
    x, y = torch.load(a), torch.load(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
