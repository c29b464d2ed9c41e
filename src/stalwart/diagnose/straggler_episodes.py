"""Straggler episodes as the agent saw them live, paired from the ledger's events (pure).

The live console prints StragglerDetected and StragglerCleared as they happen; the report lists the
episodes built here from the same events, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..events import StragglerCleared, StragglerDetected


@dataclass(frozen=True)
class StragglerEpisode:
    """One straggler as the agent saw it live: from its StragglerDetected to its StragglerCleared."""

    rank: int
    node: str
    attempt: int
    first_step: int
    last_step: int | None  # the step it cleared at; None: still slow when the attempt or run ended
    score: float  # the score when detected
    cleared_score: float | None


def episodes(events: Iterable[object]) -> tuple[StragglerEpisode, ...]:
    """Pair the ledger's StragglerDetected/StragglerCleared events per (node, attempt, rank).

    The live console prints the same events, so the report and the console cannot disagree."""

    open_: dict[tuple[str, int, int], StragglerDetected] = {}
    out: list[StragglerEpisode] = []
    for ev in sorted(
        (e for e in events if isinstance(e, (StragglerDetected, StragglerCleared))), key=lambda e: e.ts
    ):
        key = (ev.node, ev.attempt, ev.rank)
        if isinstance(ev, StragglerDetected):
            open_.setdefault(key, ev)
        elif key in open_:
            d = open_.pop(key)
            out.append(StragglerEpisode(d.rank, d.node, d.attempt, d.step, ev.step, d.score, ev.score))
    out.extend(
        StragglerEpisode(d.rank, d.node, d.attempt, d.step, None, d.score, None) for d in open_.values()
    )
    return tuple(sorted(out, key=lambda e: (e.attempt, e.first_step, e.rank)))
