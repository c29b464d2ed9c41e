"""The worker's end of its link to the agent: the message pipe and this worker's slot of the
control block. Without an agent (plain ``python``) both are absent and every call is a no-op.

The hot path goes through :meth:`WorkerLink.beat` (every step and section start) and
:meth:`WorkerLink.send` (the per-step record); neither blocks nor takes a lock. Which way a beat
travels (a store into shared memory, or a message when the agent gave no slot) is chosen once.

The link names the worker by the rank it was launched as, its identity on the agent's side, for the
life of the process: after the group shrank in place the worker trains under a new global rank
(:meth:`place`), but its messages still carry the launch rank, which is how the agent's supervisor,
hang monitor and straggler checks key it.
"""

from __future__ import annotations

import dataclasses

from ..protocol import Message, SectionBegan, StepBegan, WorkerEnv
from ..protocol.control import ControlBlock
from ..protocol.pipe import Sender


class WorkerLink:
    def __init__(self, wenv: WorkerEnv | None, *, rank: int, local_rank: int) -> None:
        self.rank = rank
        self.pipe = Sender(wenv.ipc_fd) if wenv is not None and wenv.ipc_fd >= 0 else None
        self.control = ControlBlock(wenv.control, slot=local_rank) if wenv and wenv.control else None
        self._slot = self.control if self.control is not None and self.control.slot is not None else None

    @property
    def connected(self) -> bool:
        """An agent reads this worker's messages."""
        return self.pipe is not None

    @property
    def dropped(self) -> int:
        """Messages dropped because the pipe was full (the step is never stalled for the agent)."""
        return self.pipe.dropped if self.pipe is not None else 0

    def send(self, msg: Message) -> None:
        if self.pipe is not None:
            if msg.rank != self.rank:  # a message built with the rank of a shrunk group
                msg = dataclasses.replace(msg, rank=self.rank)
            self.pipe.send(msg)

    def beat(self, step: int, section: str, t: float) -> None:
        """Heartbeat: a store into this worker's shared-memory slot (a pipe message without one)."""
        if self._slot is not None:
            self._slot.beat(t, step, section)
        elif self.pipe is None:
            return
        elif section:
            self.pipe.send(SectionBegan(self.rank, step, section, t))
        else:
            self.pipe.send(StepBegan(self.rank, step, t))

    def stop_after(self) -> int | None:
        """The step count after which the agent asked every rank to stop (-1: not asked), or None
        when there is no control block to ask through."""
        return self.control.stop_after() if self.control is not None else None

    def reform(self) -> int:
        """The process-group generation the agent asked every worker to re-form into (0: none)."""
        return self.control.reform() if self.control is not None else 0

    def place(self) -> tuple[int, int] | None:
        """(first global rank of this node, world size) of the shrunk group the agent asked this
        worker to join, or None when its place is unchanged."""
        return self.control.place() if self.control is not None else None

    def close(self) -> None:
        """Release the control block's mapping and the pipe's write end; later calls do nothing."""
        if self.control is not None:
            self.control.close()
        if self.pipe is not None:
            self.pipe.close()
        self.control = self._slot = self.pipe = None
