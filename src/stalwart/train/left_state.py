"""Live state for the loop idiom: what a surviving rank leaves in its node's memory on the way out,
and how the restarted group takes it instead of rolling back to a checkpoint (docs/fast-recovery.md).

Under :meth:`~stalwart.train.Session.run` a survivor stays alive and re-forms in place
(train/reform.py). A script that drives ``for step in session.loop(...)`` itself, with the DDP
wrapper it built before the loop, cannot: the broken group's error escapes its code and the process
ends, so the agent restarts the whole group warm. Without this module that rolled back to the newest
checkpoint although every survivor held the state of the last completed step. Now:

1. at every step start a rank records its RNG streams (train/live_rng.py, the file a replacement of
   its rank reads) and the state dicts of its objects that are neither models nor optimizers (a
   loader's position), as the in-place path does;
2. when a communication failure escapes the script (a peer is gone), the process's excepthook writes
   the state after the last completed step into one file of the node's private memory directory: a
   JSON header (the step, the tensors' layout, the SHA-256 of their bytes), one flat buffer per
   dtype, and the plain extras as ``torch.save`` bytes, read back with ``weights_only=True``
   (nothing is unpickled). It is written under a temporary name and renamed: a reader sees it whole
   or not at all. The agent, told by ``LoopStarted`` that its ranks leave state, stops the group
   within its stop grace instead of at once, so the survivors can finish the write;
3. the restarted group's ``loop`` (collective, every rank): a rank that finds a file on its node
   checks the header's layout against its own fresh objects and the digest over the bytes, loads
   it, and the group then goes on as a re-formed group does (train/live_state.py ``adopt``): the
   lowest step held wins, a rank with no file on its node receives the state from a holder point to
   point (digest checked), every rank restores its RNG record of that step; then the node's files
   are removed. ``TrainingResumed.from_checkpoint`` says ``live:rank<R>:node-memory``.

What is not left, and why: a rank whose optimizer already stepped in the interrupted step (a
collective after the update failed) leaves nothing, because taking its models as the state after the
last completed step would apply that step twice; sharded state (DTensor: FSDP, TP) is not left
either, because a lost rank's shards are held by nobody. The group then resumes from a checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..events import LEFT_IN_MEMORY, TrainingResumed
from ..protocol import Note
from . import state as state_io
from .inplace import is_comm_failure
from .live_rng import LiveRng, path_for, restore_at
from .live_state import (
    Adopted,
    Held,
    LiveStateError,
    _digest,
    _local,
    _payload,
    adopt,
    empty_buffers,
    unflatten,
)
from .reform import boundary_objects
from .update_watch import UpdateWatch

if TYPE_CHECKING:
    from .session import Session

MAGIC = b"SWLEFT1\0"
_LEN = struct.Struct("<Q")
MAX_HEAD = 1 << 24  # a header past this is not one of ours
PREFIX = "left-state-"


def file_for(directory: Path, node: str, rank: int) -> Path:
    return directory / f"{PREFIX}{node}-rank{rank}.bin"


def _opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


# Any: the user's training state (torch modules, optimizers, tensors, any object)
def write_left(path: Path, state: dict[str, Any], step: int, boundary: dict[str, Any] | None) -> int:
    """Write ``state`` as the state after ``step`` steps (its other objects as ``boundary`` says, when
    given) to ``path``, atomically; the bytes written. LiveStateError for sharded state."""
    cap = state_io.capture(state)
    if any(_local(t) is not t for t in cap.sharded.values()):
        raise ShardedState("the state is sharded (DTensor): a lost rank's shards are held by nobody")
    if boundary is not None:
        cap = state_io.Captured(cap.sharded, {**cap.extras, "objects": boundary})
    payload = _payload(cap, step=step)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb", opener=_opener) as f:
        f.write(MAGIC + _LEN.pack(len(payload.head)) + payload.head)
        for d in sorted(payload.buffers):
            f.write(payload.buffers[d].contiguous().view(torch.uint8).numpy().tobytes())
        f.write(payload.extras)
        size = f.tell()
    os.replace(tmp, path)
    return size


# Any: the user's training state; the extras are torch.load(weights_only=True) output
def read_left(path: Path, state: dict[str, Any], extras_limit: int = 1 << 30) -> int:
    """Load the state left in ``path`` into ``state`` (models, optimizers and the other objects; not
    the RNG, which is per rank); the step it is the state after. LiveStateError (nothing applied)
    when the file is not a whole state of these objects: a bad header, another layout, a short file,
    a digest that does not match."""
    targets = state_io.load_targets(state)
    mine = {k: _local(t) for k, t in targets.tensors.items()}
    with open(path, "rb", opener=_opener) as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise LiveStateError(f"{path.name} is not a left state")
        raw = f.read(_LEN.size)
        size = _LEN.unpack(raw)[0] if len(raw) == _LEN.size else -1
        if not 0 < size <= MAX_HEAD:
            raise LiveStateError(f"{path.name} has a header of {size} bytes")
        try:
            head = json.loads(f.read(size))
        except ValueError as exc:
            raise LiveStateError(f"{path.name}'s header is not JSON ({exc})") from None
        buffers: dict[str, torch.Tensor] = {}
        for d, buf in empty_buffers(head, mine, f"the state in {path.name}", f"{path.name} holds"):
            view = buf.view(torch.uint8).numpy()
            if f.readinto(view.data) != view.nbytes:
                raise LiveStateError(f"{path.name} ends inside its {d} values")
            buffers[d] = buf
        step, extras_size = head.get("step"), head.get("extras")
        if not isinstance(step, int) or step < 0 or not isinstance(extras_size, int):
            raise LiveStateError(f"{path.name}'s header has no step or extras size")
        if not 0 <= extras_size <= extras_limit:
            raise LiveStateError(f"{path.name} announces {extras_size} bytes of extras")
        if _digest(buffers) != head.get("digest"):
            raise LiveStateError(f"{path.name} fails its SHA-256 digest")
        blob = f.read(extras_size)
        if len(blob) != extras_size:
            raise LiveStateError(f"{path.name} ends inside its extras")
    extras = torch.load(io.BytesIO(blob), weights_only=True)
    unflatten(mine, buffers)
    state_io.apply(state, targets, extras, own_rng=False)
    return step


class ShardedState(LiveStateError):
    """Sharded state is not left, by design (not a failure to say): the group loads a checkpoint."""


@dataclass(frozen=True)
class Taken:
    """What the restarted group took: the live state (None: every rank resumes from a checkpoint) and
    this rank's note on a file it found but could not use ("" when none)."""

    adopted: Adopted | None
    note: str


class LeftState:
    """One rank's side: records at step starts, leaves the state on a peer failure, takes it back."""

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def __init__(self, directory: Path, node: str, rank: int, local_rank: int, state: dict[str, Any]) -> None:
        self.directory, self.node, self.rank, self.local_rank = directory, node, rank, local_rank
        self.state = state
        self.rng = LiveRng(path_for(directory, node, rank))
        self.boundary: dict[str, Any] | None = None  # Any: the other objects' state dicts at the step's start
        self.updates = UpdateWatch()  # an update landed since the step began: the models are past it

    def step_began(self, step: int) -> None:
        self.rng.write(step)
        self.boundary = boundary_objects(self.state)
        self.updates.boundary()

    def step_ended(self) -> None:
        """Between steps every object is at the boundary: a failure now leaves them as they are."""
        self.boundary = None
        self.updates.boundary()

    def leave(self, completed: int) -> str:
        """On the way out after a peer failure: write the state after ``completed`` steps; "" when it
        was written, else why not (never raises: the process is ending anyway)."""
        if self.updates.landed():
            return f"rank {self.rank}'s optimizer had stepped in step {completed}: its state is past the step"
        try:
            write_left(file_for(self.directory, self.node, self.rank), self.state, completed, self.boundary)
        except ShardedState:
            return ""
        except (LiveStateError, OSError, RuntimeError, ValueError) as exc:
            return f"rank {self.rank} could not leave its state ({exc})"
        return ""

    def _found(self) -> list[Path]:
        """The files left on this node: this rank's own first (its launch rank's), then the others."""
        own = file_for(self.directory, self.node, self.rank)
        others = sorted(p for p in self.directory.glob(f"{PREFIX}{self.node}-rank*.bin") if p != own)
        return [own, *others] if own.exists() else others

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def take(self, state: dict[str, Any], adopt_: Callable[..., Adopted | None] = adopt) -> Taken:
        """Collective over the restarted group: put the newest state left on any node into ``state``."""
        self.state = state
        held, notes = None, []
        for path in self._found():
            try:
                held = Held(state, read_left(path, state))
                break
            except Exception as exc:  # noqa: BLE001 - any file that fails is passed over, never fatal:
                notes.append(f"{path.name}: {exc}")  # this rank must still take part in the collective
        rng = path_for(self.directory, self.node, self.rank)
        try:
            got = adopt_(state, held, restore_rng=lambda step: restore_at(rng, step))
        finally:
            self.forget()
        if got is None and held is not None:  # its objects hold the file's state, not a checkpoint's
            raise LiveStateError(
                "the group could not take the state its ranks left; the next start loads a checkpoint"
            )
        return Taken(got, "; ".join(notes))

    def forget(self) -> None:
        """Remove the files this node's ranks left (each rank its own; local rank 0 every one, once the
        group took them): a later restart must never take an older state than a newer checkpoint."""
        own = file_for(self.directory, self.node, self.rank)
        for path in self._found() if self.local_rank == 0 else [own]:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        self.updates.close()
        self.rng.close()

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def resume(self, s: Session, state: dict[str, Any]) -> int | None:
        """Collective at the loop's start: the step the restarted group resumes at from the state its
        survivors left, or None (no rank left any: the session loads a checkpoint)."""
        taken = self.take(state)
        now = s.clock.now
        if taken.note:
            s._send(Note(s.rank, f"rank {s.rank}: a left state was not taken: {taken.note}", now()))
        got = taken.adopted
        if got is None:
            return None
        s._completed = got.step
        if got.rng_note:
            s._send(Note(s.rank, f"rank {s.rank}: {got.rng_note}; its random streams differ", now()))
        if s.rank == 0:
            s.emit(
                TrainingResumed(
                    ts=now(),
                    step=got.step,
                    from_checkpoint=f"live:rank{got.source}{LEFT_IN_MEMORY}",
                    **s._ctx(),
                )
            )
        return got.step

    def on_error(self, exc: BaseException, completed: int) -> str:
        """From the excepthook: leave the state when ``exc`` is a peer's failure; why not, or ""."""
        return self.leave(completed) if is_comm_failure(exc) else ""


# --- the session's side (train/session.py calls these) --------------------------------------------


# Any: the user's training state (torch modules, optimizers, tensors, any object)
def arm(s: Session, state: dict[str, Any]) -> LeftState | None:
    """The loop idiom's left state for this session, or None where it does not apply: under
    :meth:`Session.run` (the survivors stay alive), without an agent or its node memory directory,
    with ``--no-leave-state``, or alone. The same answer on every rank (the take is collective)."""
    import torch.distributed as dist  # deferred: only a loop's start gets here

    if s._left is not None:  # a later loop of the same session: its state now
        s._left.state = state
        return s._left
    w = s.worker_env
    if s._reform is not None or w is None or not w.mem_dir or not w.leave_state or not s.under_agent:
        return None
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    return LeftState(Path(w.mem_dir), s.node, s._link.rank, s.local_rank, state)
