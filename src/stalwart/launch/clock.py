"""The agent's clock, injected: wall time for timestamps and decisions, a bounded sleep, and a
monotonic reading for bounded waits. ``SystemClock`` is the real one; ``ManualClock`` is moved by hand
(unit tests, the simulator), so no decision of the supervisor needs a real process or a real second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def monotonic(self) -> float: ...


@dataclass(frozen=True)
class SystemClock:
    """Wall time (``time.time``), ``time.sleep`` and ``time.monotonic``."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to: ``sleep`` advances it instead of waiting."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._t = float(start)
        self.slept: list[float] = []

    def now(self) -> float:
        return self._t

    def monotonic(self) -> float:
        return self._t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self._t += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        self._t += seconds
