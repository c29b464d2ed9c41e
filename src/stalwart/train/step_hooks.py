"""Optional step hooks: code that runs at a Session's step boundaries (chaos faults, a profiler).

A Session without hooks pays nothing for them; with hooks, each is called at every step start, at
the end of every section, and at every step end, on the training thread.
"""

from __future__ import annotations

from typing import Protocol


class StepHook(Protocol):
    def step_began(self, step: int) -> None:
        """Step ``step`` (0-based) starts."""
        ...

    def section_ended(self, step: int, name: str) -> float:
        """A section of step ``step`` (-1 outside a step) ended; return the seconds the hook itself
        spent in it, which are counted in the section's time."""
        ...

    def step_ended(self, step: int, seconds: float) -> None:
        """Step ``step`` ended after ``seconds`` of wall time."""
        ...
