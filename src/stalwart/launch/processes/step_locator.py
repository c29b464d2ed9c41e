"""The unchanged script's own step numbers, for the bootstrap's optimizer step hooks.

Before this process's first optimizer step the locator fingerprints the parameters it starts from
and finds the step they belong to (:mod:`stalwart.train.step_history`); the hooks then number their
steps from there, so the agent, the ledger, the report, the dashboard and ``/metrics`` count the
script's real steps across restarts and requeues. Rank 0 records where it resumed and how that is
known as a ``TrainingResumed`` in its hook ledger (``script:<source>: <reason>``), as the SDK does
for its own loop. After each step the new state's fingerprint is appended to the rank's history.
A Session in the process owns the step numbers: the locator then does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...events import Event, TrainingResumed
from ...protocol.step_history import (
    INITIAL,
    ResumePoint,
    ResumeSource,
    StepHistory,
    optimizer_steps,
    resume_point,
)
from ...train import fingerprint


@dataclass(frozen=True)
class Place:
    """Whose steps these are (the ledger event's context)."""

    run_id: str
    node: str
    attempt: int
    rank: int


class StepLocator:
    """One process's step numbering: :meth:`first` at its first optimizer step, :meth:`done` after each."""

    def __init__(
        self,
        history: StepHistory,
        emit: Callable[[Event], None] | None,
        place: Place,
        clock: Callable[[], float],
    ) -> None:
        self.history = history
        self._emit = emit
        self._place = place
        self._clock = clock
        self._params: list[torch.Tensor] = []
        self.point: ResumePoint | None = None

    def first(self, optimizer: object) -> int:
        """The step the process's first optimizer step is, in the script's numbering."""
        groups = getattr(optimizer, "param_groups", ())
        params = [p for g in groups for p in g.get("params", ()) if getattr(p, "requires_grad", False)]
        self._params = list(fingerprint.pick(params))
        fp = fingerprint.sampled(self._params)
        count, fresh = optimizer_steps(optimizer)
        self.point = point = resume_point(fp, self.history.read(), count, fresh)
        if point.source is ResumeSource.FIRST_START:
            self.history.record(INITIAL, fp)
        if self._emit is not None:
            pl = self._place
            resumed = TrainingResumed(
                ts=self._clock(),
                step=point.step,
                from_checkpoint=point.label,
                run_id=pl.run_id,
                node=pl.node,
                attempt=pl.attempt,
                rank=pl.rank,
            )
            self._emit(resumed)
        return point.step

    def done(self, step: int) -> None:
        """Step ``step`` ended: record the state it left."""
        self.history.record(step, fingerprint.sampled(self._params))
