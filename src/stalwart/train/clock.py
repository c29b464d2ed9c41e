"""The SDK's clock, injected: wall time for the timestamps the agent reads, a monotonic reading for
durations, and a sleep (a checkpoint retry's backoff, an injected slowdown).

``SystemClock`` is the real one and the default; a test passes its own and needs no real second.
``SystemClock``'s methods are the ``time`` functions themselves, so the hot path pays no extra call.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall time in seconds since the epoch (what messages and ledger events carry)."""
        ...

    def monotonic(self) -> float:
        """A clock that never goes back, for durations."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """``time.time``, ``time.monotonic`` and ``time.sleep``."""

    now = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


SYSTEM_CLOCK: Clock = SystemClock()
