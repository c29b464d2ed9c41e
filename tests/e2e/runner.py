"""Run the real ``stalwart`` CLI in a subprocess and read what it left behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from stalwart.errors import LedgerError
from stalwart.events.integrity import SilentCorruption, TrainingAnomaly
from stalwart.ledger import read_available, read_merged
from widths import unwrap  # tests/ is on sys.path (its conftest)

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


def console(text: str) -> str:
    """What ``stalwart run`` printed (its stdout, alone or with stderr) with each of the console's
    lines whole again: the console wraps a line to the terminal's width (80 columns into a pipe),
    its continuations indented under the text after the clock time, so a match on its words must
    not depend on where a line broke. Output of the workers passes through unchanged."""
    return unwrap(text)


def events(run_dir: Path, kind: type | None = None) -> list:
    evs = read_merged(run_dir)
    return [e for e in evs if kind is None or isinstance(e, kind)]


def events_so_far(run_dir: Path, kind: type | None = None) -> list:
    """``events`` for polling a run still starting: none yet while its ledger directory exists but
    its first file does not (or has no tables yet), instead of the error a finished run deserves."""
    try:
        return events(run_dir, kind)
    except LedgerError:
        return []


def same_params(a: Path, b: Path) -> bool:
    x, y = torch.load(a), torch.load(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port`` (the first agent hosting the
    rendezvous store). A fixed sleep is not enough on a busy machine, where importing torch alone
    can take tens of seconds: the next agent would host the store instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the first agent exited ({proc.returncode}) before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listened on port {port} within {timeout:.0f}s")


def seen_samples(dirs: list[Path]) -> dict[int, list[int]]:
    """Each step's samples as a run of tests/e2e/sdk_scripts/inplace_ddp.py kept them (its
    ``seen-rank*.txt``). In one output directory (one set of processes and their calls of ``train``),
    a step redone in a later call replaces every record of it from an earlier one (a lost rank's
    record of the interrupted step included); a node that joined later writes to its own directory
    and counts its own calls, and its samples join the others'."""
    out: dict[int, list[int]] = {}
    for d in dirs:
        rows: dict[int, tuple[int, list[int]]] = {}
        for f in sorted(d.glob("seen-rank*.txt")):
            for line in f.read_text().split("\n"):
                if not line:
                    continue
                call, step, idx = (int(x) for x in line.split())
                kept = rows.get(step)
                if kept is None or call > kept[0]:
                    rows[step] = (call, [idx])
                elif call == kept[0]:
                    kept[1].append(idx)
        for step, (_, idxs) in rows.items():
            out.setdefault(step, []).extend(idxs)
    return out


def integrity_findings(root: Path) -> list[str]:
    """One line per SilentCorruption or TrainingAnomaly event in the ledgers under ``root``."""
    files = sorted(root.rglob("*.ledger"))
    if not files:
        return []
    events = read_available(files, require_some=False).events
    return [
        f"{type(e).__name__} on {e.node} rank {e.rank}: {getattr(e, 'reason', '')}"
        for e in events
        if isinstance(e, (SilentCorruption, TrainingAnomaly))
    ]
