"""Hang attribution (pure): which rank is the culprit when the job stops making progress.

The same judgement as the agent's ``launch.progress.detect_hang``, over plain positions instead of
the agent's tracker, so the simulator and a post-mortem over the ledger can use it too. The
culprit is the least advanced rank: the lowest step, then the earliest section in the step (a rank
still loading data holds up ranks waiting in the backward all-reduce), then the longest silent.
Others are usually victims blocked in a collective waiting for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError

# sections that mostly wait for other ranks come later: a rank stuck there is a victim, not a culprit
SECTION_ORDER = {None: 0, "data": 1, "forward": 2, "backward": 3, "optimizer": 4, "checkpoint": 5}


@dataclass(frozen=True)
class RankPosition:
    rank: int
    node: str
    step: int  # step in progress (-1: not started)
    section: str | None
    last_seen: float  # last message or heartbeat
    finished: bool = False


@dataclass(frozen=True)
class HangAttribution:
    culprit: int
    node: str
    silence_s: float
    onset: float
    step: int
    victims: tuple[int, ...]
    reason: str


def _position(p: RankPosition) -> tuple[int, int]:
    return (p.step, SECTION_ORDER.get(p.section, 2))


def attribute_hang(
    ranks: Sequence[RankPosition], now: float, timeout_s: float, phase: str = "training"
) -> HangAttribution | None:
    """``None`` until some live rank has been silent for ``timeout_s``; then the culprit and why."""
    if timeout_s <= 0:
        raise ConfigError(f"hang timeout must be > 0, got {timeout_s}")
    live = [p for p in ranks if not p.finished]
    if not live:
        return None
    if max(now - p.last_seen for p in live) < timeout_s:
        return None
    culprit = min(live, key=lambda p: (_position(p), p.last_seen))
    where = f"step {culprit.step}" if culprit.step >= 0 else "start-up"
    if culprit.section:
        where += f", section '{culprit.section}'"
    others = sorted({(p.step, p.section or "-") for p in live if p.rank != culprit.rank})
    others_txt = "; others at " + ", ".join(f"step {s} '{sec}'" for s, sec in others) if others else ""
    silence = now - culprit.last_seen
    # the timeout is reached by the longest silence, which a rank waiting for the culprit can hold (it
    # sent its last message before the culprit's): the verdict then names that silence too
    longest = min(live, key=lambda p: p.last_seen)
    reached = (
        f"; longest silence {now - longest.last_seen:.2f}s, rank {longest.rank}"
        if longest.last_seen < culprit.last_seen
        else ""
    )
    reason = (
        f"rank {culprit.rank}{f' on {culprit.node}' if culprit.node else ''} silent {silence:.2f}s at {where} "
        f"(timeout {timeout_s:.2f}s, {phase}){others_txt}{reached}"
    )
    victims = tuple(sorted(p.rank for p in live if p.rank != culprit.rank))
    return HangAttribution(
        culprit.rank, culprit.node, silence, culprit.last_seen, culprit.step, victims, reason
    )


# --- which ranks of a hung group wait in a collective, from their stacks ----------------------------

# the innermost Python frame of a rank blocked in a collective lies in one of these parts of torch: the
# collectives themselves, DDP's forward synchronisation, autograd (DDP's gradient reduction runs in the
# backward pass); a rank whose main thread stands anywhere else never reached the collective
_COLLECTIVE_PARTS = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/autograd/", "/torch/_tensor.py")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line \d+ in (?P<func>.+)$')


def _threads(dump: str) -> list[tuple[bool, list[tuple[str, str]]]]:
    """A faulthandler dump's threads: (whether it is the thread that dumped, its frames innermost
    first as (path, function))."""
    out: list[tuple[bool, list[tuple[str, str]]]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            out.append((line.startswith("Current"), []))
        elif out and (m := _FRAME.match(line)):
            out[-1][1].append((m["path"], m["func"]))
    return out


def waits_in_collective(dump: str) -> bool | None:
    """Whether a rank's main thread waits in a collective, from its faulthandler dump (every thread,
    innermost frame first). The main thread is the one that runs a module's top level (the script's,
    or the one ``python -m`` runs), else the one that dumped (Linux delivers a signal sent to a process
    to its main thread first). None when the dump shows no such thread (truncated, another format)."""
    threads = [t for t in _threads(dump) if t[1]]
    main = [frames for _, frames in threads if any(func == "<module>" for _, func in frames)]
    if len(main) != 1:
        main = [frames for current, frames in threads if current]
    if len(main) != 1:
        return None
    path = main[0][0][0].replace("\\", "/")
    return any(part in path for part in _COLLECTIVE_PARTS)
