"""What a session does between two steps and at the end of training, shared by the two ways a script
drives its steps: ``for step in session.loop(...)`` (the session's loop) and ``with session.track(...)``
(the script's own loop, its steps ended by its optimizer's updates: train/own_loop.py).

Between two steps: form the checkpoint engine's group while every rank has just met, checkpoint when
due (every N steps, or at the interval that follows the run), stop with a durable checkpoint when
asked, and re-form in place when the agent asks for a new generation. At the end: make the final
state durable (when the script checkpoints) and say that training finished.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checkpoint.auto_every import AutoEvery, auto_every_for
from ..events import TrainingFinished
from ..protocol import CheckpointDone, DurableKind

if TYPE_CHECKING:
    from .session import Session


@dataclass
class Cadence:
    """When the state is checkpointed: every ``every`` steps (0: never), or as ``auto`` decides."""

    every: int
    auto: AutoEvery | None

    def due(self, done: int) -> bool:
        if self.auto is not None:
            return self.auto.due(done)
        return bool(self.every) and done % self.every == 0

    def saved(self, done: int) -> None:
        if self.auto is not None:
            self.auto.saved(done)

    @property
    def saves(self) -> bool:
        return bool(self.every) or self.auto is not None


def steps_between(checkpoint_every: int | str) -> int:
    """The steps between two checkpoints (0: none, or "auto"); ValueError for anything else."""
    if checkpoint_every == "auto":
        return 0
    try:
        every = -1 if isinstance(checkpoint_every, bool | str) else operator.index(checkpoint_every)
    except TypeError:  # a float, None: not a count of steps
        every = -1
    if every < 0:
        raise ValueError(
            f"checkpoint_every must be a number of steps >= 0 or 'auto', not {checkpoint_every!r}"
        )
    return every


def cadence_for(s: Session, checkpoint_every: int | str) -> Cadence:
    """``checkpoint_every``: a number of steps (0: no checkpoints), or "auto"."""
    if checkpoint_every != "auto":
        return Cadence(steps_between(checkpoint_every), None)
    root = s.run_dir.root if s.run_dir else None
    emit = s.emit if s.rank == 0 else None
    w = s.worker_env  # the node's MTBF from its health history, as the agent passed it
    mtbf = w.history_mtbf_s if w is not None and w.history_mtbf_s > 0 else None
    return Cadence(0, auto_every_for(s._ckpt.engine, root, s.clock.now, emit, s._ctx, mtbf))


def bind_hooks(s: Session, state: dict[str, Any]) -> None:  # Any: user state (torch objects)
    """A step hook that acts on the state (a chaos bitflip) is handed it."""
    for hook in s._hooks:
        bind = getattr(hook, "bind_state", None)
        if callable(bind):
            bind(state)


# Any: user state (torch objects)
def between_steps(s: Session, state: dict[str, Any], cadence: Cadence, saving: bool) -> None:
    """After a step ended (its record sent) and any check of its state: checkpoint when ``saving``,
    stop when asked (raises SystemExit), raise ``Reform`` when the agent asked for a new generation."""
    if saving:
        s.save(state)
        cadence.saved(s.completed)
    if s._stop_requested():
        s._stop(state)
    if s._reform is not None:
        s._reform.check()


def end_training(s: Session, state: dict[str, Any], checkpoint_every: int | str) -> None:  # Any: user state
    """The last step is done: make its state durable when the script checkpoints (else wait for any
    persist in flight) and say that training finished."""
    if s._anomalies is not None:
        s._anomalies.flush()  # the last steps' values still on their way from the device
    if checkpoint_every:
        why = s.make_durable(state, emergency=False)
        s._send(CheckpointDone(s.rank, s.completed, s.clock.now(), not why, why, DurableKind.FINAL))
    else:
        s._ckpt.wait()
    if s.rank == 0:
        s.emit(TrainingFinished(ts=s.clock.now(), step=s.completed, **s._ctx()))
