"""``checkpoint_every="auto"``: the checkpoint interval follows the run.

After every save the interval is decided again by :func:`~stalwart.checkpoint.advisor.decide_interval`
(Daly's optimum on the measured stall and MTBF, never shorter than the slowest tier's persist, so a
save never waits on the previous persist) from this attempt's measurements:

- seconds per step (the median of the wall time between steps, saves included);
- the stall of a save (the engine's ``last_stall_s``) and the persist time (its ``last_persist_s``,
  slowest tier);
- the MTBF: the run's own (failures in the ledger over its training time), else the node history,
  else :data:`~stalwart.checkpoint.advisor.DEFAULT_MTBF_S`.

Every rank must save at the same steps, so the inputs are agreed (the maximum of each time and the
shortest MTBF over the ranks, one small all-reduce per save) and every rank takes the same decision.
Each change is a ``CheckpointIntervalAdvised`` event (``tier="all"``, ``applied=True``) with its
reason. ``plan --ledger`` recommends with the same function over the recorded run
(:func:`~stalwart.checkpoint.advisor.recommend_from_ledger`).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..events import Event, FailureDetected, StepCompleted
from ..events.checkpoint import CheckpointIntervalAdvised
from ..ledger.store import read_available
from .advisor import AutoInputs, IntervalChoice, decide_interval, mtbf_of_run

if TYPE_CHECKING:
    from .engine import CheckpointEngine  # engine pulls in torch

__all__ = ["FIRST_SAVE_STEPS", "AutoEvery", "auto_every_for", "run_failures"]

FIRST_SAVE_STEPS = 10  # before anything is measured: a first save to measure its stall and persist
_KEPT = 200  # step times kept for the median


def run_failures(events: Iterable[Event]) -> tuple[int, float]:
    """Failures the run had so far and the seconds it trained (step time summed, per rank)."""

    failures, total, ranks = 0, 0.0, set()
    for e in events:
        if isinstance(e, FailureDetected):
            failures += 1
        elif isinstance(e, StepCompleted):
            total += e.duration
            ranks.add(e.rank)
    return failures, total / max(1, len(ranks))


def _agree_max(values: list[float]) -> list[float]:
    """The element-wise maximum over the ranks (identity outside a process group)."""
    import torch  # deferred: heavy (torch)
    import torch.distributed as dist  # deferred: heavy (torch)

    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t.tolist()]


class AutoEvery:
    """Decides after each save how many steps until the next (see the module's docstring)."""

    def __init__(
        self,
        *,
        stall: Callable[[], float | None],
        persist: Callable[[], float | None],
        now: Callable[[], float],
        failures: int = 0,
        training_s: float = 0.0,
        history_mtbf_s: float | None = None,
        emit: Callable[[Event], None] | None = None,
        # Any: an event's context is JSON of any shape (json.dumps)
        context: Callable[[], dict[str, Any]] = dict,
        agree: Callable[[list[float]], list[float]] = _agree_max,
    ) -> None:
        self._stall, self._persist, self._now = stall, persist, now
        self._failures, self._trained, self._history = failures, training_s, history_mtbf_s
        self._emit, self._context, self._agree = emit, context, agree
        self._times: deque[float] = deque(maxlen=_KEPT)
        self._last_t: float | None = None
        self._last_save = -1
        self.steps = FIRST_SAVE_STEPS
        self.choices: list[IntervalChoice] = []

    def due(self, completed: int) -> bool:
        """Call once after each step with the steps completed: whether to save now."""
        t = self._now()
        if self._last_t is not None:
            self._times.append(t - self._last_t)
            self._trained += t - self._last_t
        self._last_t = t
        if self._last_save < 0:  # the loop (re)started after completed - 1 steps
            self._last_save = completed - 1
        return completed - self._last_save >= self.steps

    def saved(self, completed: int) -> IntervalChoice | None:
        """A save of ``completed`` steps was staged (on every rank): decide the next interval."""
        self._last_save = completed
        stall, persist = self._stall(), self._persist()
        if stall is None or not self._times:
            return None
        mtbf, source = mtbf_of_run(self._failures, self._trained, self._history)
        step_s, stall_s, persist_s, neg_mtbf = self._agree(
            [statistics.median(self._times), stall, persist or 0.0, -mtbf]
        )
        if -neg_mtbf != mtbf:  # ranks read the ledger at slightly different moments
            source = f"{source}; the shortest over the ranks"
        choice = decide_interval(AutoInputs(step_s, stall_s, persist_s, -neg_mtbf, source))
        if choice.steps != self.steps or not self.choices:
            self.steps = choice.steps
            if self._emit is not None:
                self._emit(
                    CheckpointIntervalAdvised(
                        ts=self._now(),
                        tier="all",
                        interval_steps=choice.steps,
                        interval_s=choice.interval_s,
                        reason=f"step {completed}: {choice.reason}",
                        applied=True,
                        **self._context(),
                    )
                )
        self.choices.append(choice)
        return choice


def auto_every_for(
    engine: CheckpointEngine,
    run_root: Path | None,
    now: Callable[[], float],
    emit: Callable[[Event], None] | None,
    context: Callable[[], dict[str, Any]],  # Any: an event's context is JSON of any shape (json.dumps)
    history_mtbf_s: float | None = None,
) -> AutoEvery:
    """An :class:`AutoEvery` on a checkpoint engine's measurements, the run's ledger so far and the
    node's failure history (the agent passes its MTBF; the session's one call)."""

    found = read_available(run_root, require_some=False).events if run_root is not None else []
    failures, trained = run_failures(found)
    return AutoEvery(
        stall=lambda: engine.last_stall_s,
        persist=lambda: max(engine.last_persist_s.values(), default=None),
        now=now,
        failures=failures,
        training_s=trained,
        history_mtbf_s=history_mtbf_s,
        emit=emit,
        context=context,
    )
