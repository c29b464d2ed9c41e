"""A worker that finished its training but never exits: the last wait of an attempt, bounded.

Every rank said its training finished (the SDK's ``finish``), yet a process stays: a process-group
destructor deadlocked on a peer that already left, a data-loader worker never joined, a thread that
is not a daemon. Nothing else would end the attempt, since a finished rank is no longer watched for
hangs. After the process-group timeout from the last rank's finish (the validated bound a collective
of that rank would have had, policy/timeouts.py) the group is stopped, and the attempt ends as the
finished training warrants: succeeded when the final state committed, final-unsaved otherwise. A
script's own work after ``finish`` (an upload, an evaluation) has that long.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.job import AttemptStatus
from .decision import AttemptOutcome, Decision, DecisionKind
from .progress import durability_problem_in
from .snapshot import Snapshot


@dataclass(frozen=True)
class FinishedNotExited:
    bound_s: float  # the process-group timeout

    def __call__(self, s: Snapshot) -> Decision | None:
        if not s.ranks or s.stop_requested_at is not None or not all(r.finished for r in s.ranks):
            return None
        alive = sorted(r for r, c in s.codes.items() if c is None)
        last = max(r.finished_at for r in s.ranks)
        if not alive or s.now - last < self.bound_s:
            return None
        shown = ", ".join(str(r) for r in alive[:8])
        reason = (
            f"every rank finished its training, but rank {shown} did not exit within {self.bound_s:g}s "
            "(the process-group timeout) of the last finish: stopped"
        )
        why = durability_problem_in(s.durability, "final")
        if why:
            outcome = AttemptOutcome(AttemptStatus.FINAL_UNSAVED, detail=why, step=s.max_done_step + 1)
            return Decision(
                DecisionKind.DEADLINE, f"{reason}; the final state was not committed: {why}", outcome
            )
        return Decision(DecisionKind.DEADLINE, reason, AttemptOutcome(AttemptStatus.SUCCEEDED))
