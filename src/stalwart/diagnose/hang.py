"""Hang attribution (pure): which rank is the culprit when the job stops making progress.

The same judgement as the agent's ``launch.progress.detect_hang``, over plain positions instead of
the agent's tracker, so the simulator and a post-mortem over the ledger can use it too. The
culprit is the least advanced rank: the lowest step, then the earliest section in the step (a rank
still loading data holds up ranks waiting in the backward all-reduce), then the longest silent.
Others are usually victims blocked in a collective waiting for it.
"""

from __future__ import annotations

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
    reason = (
        f"rank {culprit.rank}{f' on {culprit.node}' if culprit.node else ''} silent {silence:.2f}s at {where} "
        f"(timeout {timeout_s:.2f}s, {phase}){others_txt}"
    )
    victims = tuple(sorted(p.rank for p in live if p.rank != culprit.rank))
    return HangAttribution(
        culprit.rank, culprit.node, silence, culprit.last_seen, culprit.step, victims, reason
    )
