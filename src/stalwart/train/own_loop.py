"""The script's own loop: ``Session.track``.

A script that keeps its own loop (epochs over a loader, its own step counter, ``while`` and ``break``:
a loop that is not ``for step in session.loop(...)``) registers its state once and says where each
step ends:

    with session.track(state, checkpoint_every=50) as steps:
        step = steps.start                      # the steps already done: resumed
        for epoch in range(step // per_epoch, epochs):
            for batch in loader:
                ... forward, backward, optimizer.step(), scheduler.step() ...
                steps.done()                    # the step ends here
                step += 1

On entry it resumes, as ``loop`` does: from the live state the survivors left in the node's memory
when a peer failed (left_state.py), else from a re-formed group's live state under ``Session.run``,
else from the newest good checkpoint. ``done()`` does what ``loop`` does between two steps
(cadence.py): the step's record, a checkpoint when due, an emergency checkpoint and exit when asked to
stop, a re-formation in place under ``Session.run``; then the next step begins (its RNG record and its
other objects' state, for a redo). Leaving the block without an error ends training (the final state
is made durable when the script checkpoints).

Why an explicit call rather than the optimizer's update: work after ``optimizer.step()`` in the same
iteration (``scheduler.step()``, a ``GradScaler.update()``, a loss all-reduce for logging) belongs to
that step. A step ended at the update would checkpoint the scheduler one step behind and resume off
by one, and an update a ``GradScaler`` skips would not be a step at all.

Silent-data-corruption replica checks (docs/sdc.md) need ``session.loop``.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..protocol import LoopStarted
from .cadence import Cadence, between_steps, bind_hooks, cadence_for, end_training, steps_between
from .left_state import arm

if TYPE_CHECKING:
    from .session import Session


class Tracked:
    """``with session.track(state, ...) as steps:`` (see the module's text): ``steps.start`` is the
    number of steps already done, ``steps.done()`` ends the step in progress."""

    def __init__(
        self,
        session: Session,
        state: dict[str, Any],  # Any: the user's training state (torch modules, optimizers, any object)
        *,
        total_steps: int,
        checkpoint_every: int | str,
        resume: bool,
    ) -> None:
        if total_steps < 0:
            raise ValueError(f"total_steps must be >= 0 (0: not known), not {total_steps}")
        steps_between(checkpoint_every)  # a bad value is refused before anything runs
        self.session, self.state = session, state
        self.total_steps, self.checkpoint_every, self.resume = total_steps, checkpoint_every, resume
        self.start = 0
        self._cadence: Cadence | None = None

    def __enter__(self) -> Tracked:
        s, state = self.session, self.state
        if self._cadence is not None:
            raise RuntimeError("this track(...) is already in use: call session.track again for a new block")
        s._left = arm(s, state)  # the state left on the way out when a peer fails (left_state.py)
        self.start = start = s._start(state, self.resume)
        self._cadence = cadence_for(s, self.checkpoint_every)
        bind_hooks(s, state)
        s._send(LoopStarted(s.rank, start, self.total_steps, s.clock.now(), leaves_state=s._left is not None))
        s._begin_step(start)
        return self

    @property
    def step(self) -> int:
        """The step in progress (the steps done so far)."""
        return self.session.completed

    def done(self) -> None:
        """The step in progress ended (every rank, at the same step): record it, checkpoint when due,
        stop when asked (SystemExit with the emergency checkpoint's code), re-form when asked; then the
        next step begins."""
        s, cadence = self.session, self._cadence
        if cadence is None or s._step is None:
            raise RuntimeError("steps.done() is called inside its `with session.track(...)` block only")
        s._end_step(s._step)
        if cadence.saves:  # every rank just met in the step's collectives: the engine's group forms now
            s._ckpt.prepare()
        between_steps(s, self.state, cadence, cadence.due(s.completed))
        s._begin_step(s.completed)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        s = self.session
        self._cadence = None
        if kind is None:  # an error leaves the step it struck in progress, for its error record
            s._step = None  # the step begun after the last done() never ran
            end_training(s, self.state, self.checkpoint_every)
