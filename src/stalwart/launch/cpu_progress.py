"""Hang detection for workers that no hook and no SDK ever reported, from what the agent can see of
each worker process. A last resort: a worker whose optimizer-step hooks fired (the worker bootstrap)
or that uses the SDK is judged by its messages instead (``progress.py``).

Collector: ``read_proc`` reads a worker's state and CPU time from ``/proc/<pid>/stat``.
Policy: ``detect_cpu_stall`` (pure) decides from per-rank samples. Idleness is no evidence of a
hang: a healthy job waits too (one small all-reduce every 0.5 s, a rank reading slow storage, an RL
rollout). So:

* a rank stopped by a signal (state ``T``/``t``) with no CPU progress for ``stopped_s`` is the culprit
  (a stopped process is evidence);
* otherwise only when **every** live rank has made no CPU progress for ``stall_s`` is it a hang, and
  the rank that stopped progressing first is blamed (the others went idle waiting for it). The agent's
  default ``stall_s`` is the process-group timeout, so no healthy job that waits is declared hung
  before its own collectives would have timed out.

A slow collective, or rank 0 evaluating while the others wait, is never a hang: the busy rank
keeps burning CPU. Background threads of an idle rank burn a little CPU: progress means more than
``min_busy`` of the elapsed time since the last progress (plus a fixed 50 ms).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcSample:
    state: str  # R, S, D, T, t, Z, ...
    cpu_s: float  # user + system CPU time of the whole process


def read_proc(pid: int, proc: Path = Path("/proc")) -> ProcSample | None:
    """One sample of a process, or None if it is gone or /proc is unavailable."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may contain spaces: split after the last ')'
    rest = text[text.rfind(")") + 2 :].split()
    try:
        return ProcSample(rest[0], (int(rest[11]) + int(rest[12])) / _HZ)
    except (IndexError, ValueError):
        return None


@dataclass
class CpuProgress:
    """Collector state of one rank: when it last made CPU progress, and the CPU time then."""

    since: float
    cpu_ref: float = -1.0
    state: str = "R"

    def observe(
        self, sample: ProcSample, now: float, *, min_busy: float = 0.02, floor_s: float = 0.05
    ) -> None:
        self.state = sample.state
        if self.cpu_ref < 0:
            self.cpu_ref, self.since = sample.cpu_s, now
            return
        if sample.cpu_s - self.cpu_ref > floor_s + min_busy * (now - self.since):
            self.cpu_ref, self.since = sample.cpu_s, now


@dataclass(frozen=True)
class CpuStall:
    culprit: int
    stalled_s: float
    onset: float
    evidence: str


class CpuState(Protocol):
    """What the policy reads of a rank: the collector's :class:`CpuProgress` or a frozen copy."""

    @property
    def since(self) -> float: ...

    @property
    def state(self) -> str: ...


def detect_cpu_stall(
    ranks: Mapping[int, CpuState], now: float, stall_s: float, stopped_s: float | None = None
) -> CpuStall | None:
    """Pure: a verdict when a stopped rank has made no CPU progress for ``stopped_s`` (default
    ``stall_s``), or every rank for ``stall_s``."""
    if not ranks:
        return None
    stop_limit = stall_s if stopped_s is None else stopped_s
    stopped = [(r, p) for r, p in ranks.items() if p.state in ("T", "t") and now - p.since >= stop_limit]
    if stopped:
        r, p = min(stopped, key=lambda x: x[1].since)
        return CpuStall(
            r,
            now - p.since,
            p.since,
            f"rank {r} stopped (process state {p.state}) and used no CPU "
            f"for {now - p.since:.2f}s (timeout {stop_limit:.2f}s, no hook or SDK: process state)",
        )
    if all(now - p.since >= stall_s for p in ranks.values()):
        r, p = min(ranks.items(), key=lambda x: (x[1].since, x[0]))
        return CpuStall(
            r,
            now - p.since,
            p.since,
            f"rank {r} stopped using CPU first, {now - p.since:.2f}s ago, "
            f"and every rank has been idle since (timeout {stall_s:.2f}s, no hook or SDK: CPU progress)",
        )
    return None
