"""The one adapter between a framework callback and the SDK's step primitives.

A framework owns its loop, so the callbacks cannot use ``Session.loop``; they mark step boundaries,
sections, evaluation heartbeats and checkpoints through this class instead. Everything the callbacks
need from the SDK goes through here, so a change to ``Session`` is absorbed in this one file.
"""

from __future__ import annotations

from pathlib import Path

from ..events import CheckpointCommitted, TrainingFinished, TrainingResumed
from ..protocol import CHECKPOINT_SECTION, CheckpointDone, DurableKind, LoopStarted, Note
from ..train.session import Session
from ..train.session_scopes import Section

EVALUATION = "evaluation"


class StepLink:
    """Step boundaries, sections and checkpoints of a loop that someone else runs."""

    def __init__(self, session: Session | None = None) -> None:
        self.session = session or Session()
        self._open: dict[str, Section] = {}
        self._in_step = False
        self.stop_taken = False

    # --- identity ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.session.rank

    @property
    def under_agent(self) -> bool:
        return self.session.under_agent

    def checkpoint_dir(self, name: str) -> Path:
        """Where a framework's own checkpoints go: inside the run directory under the agent."""
        if self.session.run_dir is not None:
            return self.session.run_dir.checkpoints / name
        return Path("checkpoints") / name

    def reclaim_signals(self) -> None:
        """Put the SDK's SIGTERM/SIGUSR1 handler back (a framework may install its own at fit start).

        Under the agent a signal only asks for a coordinated stop: every rank stops after the same
        step and saves an emergency checkpoint, instead of the framework exiting on its own."""
        self.session._reclaim_signals()

    # --- the loop ---------------------------------------------------------------------------

    def started(
        self, first_step: int, total_steps: int, from_checkpoint: str = "", *, leaves_state: bool = False
    ) -> None:
        """The loop starts (or resumes) at ``first_step`` of ``total_steps``; ``leaves_state``: on a
        peer's failure this rank leaves its live state on the node (the agent gives it its stop grace)."""
        s = self.session
        s._completed = first_step
        s._ckpt.last_saved = first_step if from_checkpoint else -1
        if s.rank == 0:
            s.emit(
                TrainingResumed(
                    ts=s.clock.now(), step=first_step, from_checkpoint=from_checkpoint, **s._ctx()
                )
            )
        s._send(LoopStarted(s.rank, first_step, total_steps, s.clock.now(), leaves_state))

    def begin_step(self, step: int) -> None:
        if self._in_step:  # a step the framework skipped ending (e.g. a skipped optimizer step)
            self.end_step(step - 1)
        self._in_step = True
        self.session._begin_step(step)  # also where chaos faults for this rank fire

    def section_begin(self, name: str) -> None:
        self.section_end()
        sec = self.session.section(name)
        sec.__enter__()
        self._open[name] = sec

    def section_end(self) -> None:
        for sec in self._open.values():
            sec.__exit__(None, None, None)
        self._open.clear()

    def end_step(self, step: int) -> None:
        if not self._in_step:
            return
        self.section_end()
        self._in_step = False
        self.session._end_step(step)

    def beat(self, phase: str = EVALUATION) -> None:
        """A heartbeat outside a training step (evaluation): progress, not a hang."""
        s = self.session
        s._beat(s.completed, phase, s.clock.now())

    def note(self, text: str) -> None:
        """A line for the agent's console and ledger (something the user should know, not a failure)."""
        s = self.session
        s._send(Note(s.rank, text, s.clock.now()))

    def stop_requested(self) -> bool:
        """True once the agent (or a signal) asked every rank to stop after the current step."""
        return self.session._stop_requested()

    @property
    def completed(self) -> int:
        return self.session.completed

    @property
    def last_saved(self) -> int:
        """The step count of the newest checkpoint this process saved or resumed from (-1: none)."""
        return self.session._ckpt.last_saved

    # --- checkpoints written by the framework -----------------------------------------------

    def checkpoint_begin(self) -> float:
        t0 = self.session.clock.now()
        self.session._beat(self.completed, CHECKPOINT_SECTION, t0)
        return t0

    def checkpoint_end(self, t0: float, path: str | Path, *, emergency: bool = False) -> None:
        s = self.session
        stall = s.clock.now() - t0
        s._ckpt.last_saved = s.completed
        if s.rank == 0:
            size = _size(Path(path))
            s.emit(
                CheckpointCommitted(
                    ts=s.clock.now(),
                    step=s.completed,
                    path=str(path),
                    stall_s=stall,
                    bytes=size,
                    tier="framework",
                    emergency=emergency,
                    **s._ctx(),
                )
            )
        # the framework's own save returned: its files are written, so an emergency save is committed
        if emergency:
            s._send(CheckpointDone(s.rank, s.completed, s.clock.now(), True, "", DurableKind.EMERGENCY))
        else:
            s._send(CheckpointDone(s.rank, s.completed, s.clock.now()))

    def finish(self, *, preempted: bool = False) -> None:
        s = self.session
        self.end_step(s.completed)
        if s.rank == 0 and not preempted:
            s.emit(TrainingFinished(ts=s.clock.now(), step=s.completed, **s._ctx()))
        s.finish(preempted=preempted)


def _size(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:
        return 0
