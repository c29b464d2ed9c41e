"""The small scopes of a Session: a section of a step, a long phase outside the steps, and which of
its events the agent's console shows live. Split from ``session.py``, which they serve."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..events import CheckpointLoaded, CheckpointRejected, Event
from ..events.checkpoint import CheckpointPersistFailed
from ..events.integrity import TrainingAnomaly
from ..protocol import PhaseChanged

if TYPE_CHECKING:
    from .session import Session


def live_note(ev: Event) -> str:
    """A line worth showing live on the agent's console for a checkpoint event or a training
    anomaly, or ""."""
    if isinstance(ev, TrainingAnomaly):  # a signal: the console says so, training goes on
        more = f" ({ev.repeats} anomalous steps since the last report)" if ev.repeats else ""
        return f"training anomaly on rank {ev.rank}: {ev.reason}{more}; training goes on"
    if isinstance(ev, CheckpointLoaded) and ev.tier == "peer":  # state from a peer
        return f"checkpoint of step {ev.step} restored from a peer's copy"
    if isinstance(ev, CheckpointRejected):  # a fallback to an older checkpoint
        return f"checkpoint {Path(ev.path).name} rejected: {ev.reason}"
    if isinstance(ev, CheckpointPersistFailed):  # and a save that did not commit
        return f"checkpoint of step {ev.step} not committed to {ev.tier}: {ev.reason}"
    return ""


class Phase:
    __slots__ = ("_session", "_name", "_budget")

    def __init__(self, session: Session, name: str, budget_s: float) -> None:
        self._session = session
        self._name = name
        self._budget = budget_s

    def __enter__(self) -> None:
        s = self._session
        s._send(PhaseChanged(s.rank, self._name, self._budget, s._now()))

    def __exit__(self, *exc: object) -> None:
        s = self._session
        s._send(PhaseChanged(s.rank, "", 0.0, s._now()))


class Section:
    """A section's context manager (a plain class: ``contextlib`` costs ~5 us per use)."""

    __slots__ = ("_session", "_name", "_t0")

    def __init__(self, session: Session, name: str) -> None:
        self._session = session
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> None:
        s = self._session
        self._t0 = t = s._now()
        s._link.beat(s._step if s._step is not None else s._completed, self._name, t)

    def __exit__(self, *exc: object) -> None:
        self._session._section_done(self._name, self._t0)
