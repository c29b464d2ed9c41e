"""The session's in-place recovery: runs the script's training function, re-forms the process group
in place when a peer fails, and hands the next generation the live state (train/inplace.py says how
a survivor leaves a broken group; train/live_state.py how the state moves; train/live_rng.py where a
rank's RNG streams are kept).

Every phase is timed on the worker and reported to the agent with :class:`~stalwart.protocol.Reformed`:
``abort`` (failure caught -> old group torn down), ``wait`` (-> the agent's request), ``rendezvous``
(the training function's set-up up to the new group, including waiting for the replacements), and
``transfer`` (agreeing on the step and moving the state).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from ..events import TrainingResumed
from ..protocol import Note, PhaseChanged, Reformed, Reforming, WorkerPlace
from .inplace import Generation, Reform, StuckStep, abandon_group, is_comm_failure
from .live_rng import LiveRng, path_for, restore_at
from .live_state import Adopted, Held, LiveStateError, adopt
from .state import Captured, capture
from .step_commit import StepCommit
from .update_watch import UpdateWatch

if TYPE_CHECKING:
    from .session import Session

T = TypeVar("T")
PHASE = "in-place"  # the phase name the agent sees while a rank re-forms (its hang budget applies)


@dataclass
class Reformer:
    session: Session
    generation: Generation
    timeout_s: float  # bound on each wait: the agent's request, the new group, the transfer
    rng_dir: Path
    held: Held | None = None
    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    state: dict[str, Any] | None = None
    phases: dict[str, float] = field(default_factory=dict)
    t_rejoin: float = 0.0  # when this rank started joining the current generation
    # (step, the other objects' state at its start); Any: state dicts of the user's objects
    boundary: tuple[int, dict[str, Any] | None] = (-1, None)
    _rng: LiveRng | None = None
    _store: dist.TCPStore | None = None  # the client of the agent's store for generations > 0
    joining: bool = False  # started as a replacement: say so once it is about to join its generation
    _stuck: StuckStep | None = None  # severs a step stuck on a silent host once a re-form is asked
    # a sharded step's commit, and the copy of the state before a step whose commit failed
    _commit: StepCommit | None = None
    spare: tuple[int, Captured] | None = None
    # whether an update of the step in progress landed: the objects are then past its start
    _updates: UpdateWatch | None = None

    @property
    def rank_rng(self) -> LiveRng:
        if self._rng is None:
            s = self.session
            self._rng = LiveRng(path_for(self.rng_dir, s.node, s._link.rank))  # its launch rank's record
        return self._rng

    # --- the training function ------------------------------------------------------------------

    def run(self, fn: Callable[[Session], T]) -> T:
        s = self.session
        if self._stuck is None:
            self._stuck = StuckStep(self.generation, int(s.env.get("MASTER_PORT", "0") or 0))
            self._stuck.start()
        while True:
            try:
                return fn(s)
            except BaseException as exc:  # noqa: BLE001 - filtered just below; everything else re-raised
                if not is_comm_failure(exc) or not s.under_agent:
                    raise
                if not self._reform(exc):
                    raise

    def _reform(self, exc: BaseException) -> bool:
        """Leave the broken group and wait for the agent's request; False: re-form is not coming."""
        s, now = self.session, self.session.clock.now
        t0 = now()
        s._send(PhaseChanged(s.rank, PHASE, self.timeout_s * 3, t0))
        port = int(s.env.get("MASTER_PORT", "0") or 0)
        abandon_group(port)
        s._ckpt.abandon(self.timeout_s)  # its engine's group was the old generation's
        t1 = now()
        s._send(Reforming(s.rank, self.generation.current + 1, t1 - t0, t1))
        want = exc.generation if isinstance(exc, Reform) else self.generation.wait(self.timeout_s)
        if not want:
            s._send(PhaseChanged(s.rank, "", 0.0, now()))
            return False
        if self.state is not None:
            self.held = self.holding(s.completed)
        self.state, self.spare = None, None
        self.generation.current = want
        self.take_place()
        self.phases = {"abort": t1 - t0, "wait": now() - t1}
        self.t_rejoin = now()
        return True

    def holding(self, completed: int) -> Held:
        """What this rank holds for the next generation after ``completed`` steps. An update that
        landed in the interrupted step (a collective after the optimizer step failed: a loss all-reduce
        for logging, a step-end check) leaves the objects past that step's start: they are not the
        state after ``completed`` steps, and only a copy from before the update (kept when its commit
        failed) is. Taking them as that state would apply the step twice."""
        assert self.state is not None
        step, objs = self.boundary
        spare = self.spare
        if self._updates is not None and self._updates.landed(completed):
            return Held(self.state, -1, None, spare if spare is not None and spare[0] == completed else None)
        kept = spare if spare is not None and spare[0] == completed - 1 else None
        return Held(self.state, completed, objs if step == completed else None, kept)

    def take_place(self) -> None:
        """Take the place the agent gave this node in a group that shrank in place (none: unchanged)."""
        place = self.session._link.place()
        if place is not None:
            move(self.session, *place)

    # --- the process group and the state --------------------------------------------------------

    # Any: forwarded to torch.distributed.init_process_group
    def init_group(self, backend: str, rank: int, world_size: int, **kwargs: Any) -> None:
        """Join this generation's process group through a fresh prefix of the agent's store."""

        env = self.session.env
        timeout = timedelta(seconds=self.timeout_s)
        if self._store is None:
            self._store = dist.TCPStore(
                env.get("MASTER_ADDR", "127.0.0.1"),
                int(env.get("MASTER_PORT", "0")),
                None,
                False,
                timeout=timeout,
            )
        kwargs["timeout"] = kwargs.get("timeout", timeout)
        if self.joining:  # a newcomer's agent tells the group it may re-form now (launch/inplace/nodes.py)
            self.joining = False
            s, t = self.session, self.session.clock.now()
            s._send(Reforming(s.rank, self.generation.current, 0.0, t))
        prefixed = dist.PrefixStore(self.generation.store_prefix(), self._store)
        dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size, **kwargs)

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def take_live_state(self, state: dict[str, Any]) -> Adopted | None:
        """In a re-formed group: the newest live state into ``state`` (collective), or None when there
        is none (the caller then resumes from a checkpoint). A layout or digest mismatch raises, so
        that the agent takes the next rung (a whole-group restart from a checkpoint)."""
        self.state, self.spare = state, None
        if self._commit is None:
            self._commit = StepCommit(self.keep_before)
            self._updates = UpdateWatch(lambda: self.session.completed)
        assert self._updates is not None
        self._updates.forget()
        self._commit.attach(state)
        if self.generation.current == 0:
            return None
        now = self.session.clock.now
        t0 = now()
        rejoin = self.t_rejoin or t0
        held, self.held = self.held, None
        try:
            got = adopt(state, held, restore_rng=lambda step: restore_at(self.rank_rng.path, step))
        except LiveStateError as exc:
            raise RuntimeError(f"in-place recovery: {exc}") from None
        if got is None and held is not None:
            s = self.session
            s._send(
                Note(
                    s.rank,
                    f"rank {s.rank}: no live replica holds every rank's part of the state in the group "
                    f"of {s.world_size}: resuming from the newest checkpoint",
                    now(),
                )
            )
        self.phases.update({"rendezvous": t0 - rejoin, "transfer": now() - t0})
        return got

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def start(self, state: dict[str, Any], resume: bool) -> int | None:
        """The step a re-formed group's loop starts at (the live state, else a checkpoint); None in
        generation 0 (the session resumes as usual)."""
        s = self.session
        got = self.take_live_state(state)
        if got is None:
            if self.generation.current == 0:
                return None
            step = s.resume(state) if resume else 0  # no live replica of every shard: a checkpoint
            self.joined(step, 0)
            return step
        self.joined(got.step, got.received)
        s._completed = got.step
        if got.rng_note:
            s._send(Note(s.rank, f"rank {s.rank}: {got.rng_note}; its random streams differ", s.clock.now()))
        if s.rank == 0:
            s.emit(
                TrainingResumed(
                    ts=s.clock.now(), step=got.step, from_checkpoint=f"live:rank{got.source}", **s._ctx()
                )
            )
        return got.step

    def keep_before(self) -> bool:
        """A sharded step's commit failed (train/step_commit.py): keep a copy of the state before this
        step's update, once per generation, so the update may land; False: the failure stands."""
        step, objs = self.boundary
        s = self.session
        if self.spare is not None or self.state is None or objs is None or step != s.completed:
            return False
        opts = [v for v in self.state.values() if isinstance(v, torch.optim.Optimizer)]
        if any(not o.state for o in opts):  # no step taken yet: a checkpoint's start is as good
            return False
        cap = capture(self.state)  # the sharded state dicts: local, no collective
        with torch.no_grad():
            copied = {k: t.detach().clone() for k, t in cap.sharded.items()}
        self.spare = (step, Captured(copied, {**cap.extras, "objects": objs}))
        s._send(
            Note(
                s.rank,
                f"rank {s.rank}: the commit of step {step} failed after its gradients were reduced; its "
                f"update lands, and a copy of the state after {step} steps is kept for the re-formed group",
                s.clock.now(),
            )
        )
        return True

    def joined(self, step: int, received: int) -> None:
        """This rank is in the re-formed group with the state after ``step`` steps (from a replica, or
        from a checkpoint when no live replica held every rank's shards): tell the agent."""
        s, now = self.session, self.session.clock.now
        if self.generation.current == 0:
            return
        s._send(PhaseChanged(s.rank, "", 0.0, now()))
        s._send(Reformed(s.rank, self.generation.current, step, received, dict(self.phases), now()))

    def step_began(self, step: int) -> None:
        """At every step start: the RNG record (for a replacement of this rank) and the state dicts of
        the objects a step changes before its end (a loader's position), for a redo of this step."""
        self.rank_rng.write(step)
        if self.state is not None:
            self.boundary = (step, boundary_objects(self.state))
        if self._stuck is not None:
            self._stuck.step_began()

    def check(self) -> None:
        """Between two steps: raise :class:`Reform` when the agent asked for a new generation."""
        if self._stuck is not None:
            self._stuck.boundary()
        want = self.generation.requested()
        if want:
            raise Reform(want)

    def close(self) -> None:
        if self._commit is not None:
            self._commit.detach()
        if self._updates is not None:
            self._updates.close()
        if self._rng is not None:
            self._rng.close()
        if self._stuck is not None:
            self._stuck.close()


# the variables a worker's environment names its place with (protocol.elastic_env)
PLACE_VARS = ("RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")


def move(s: Session, first_rank: int, world_size: int) -> None:
    """The group shrank in place: this worker trains from now on as global rank ``first_rank +
    local_rank`` of ``world_size``. The session's rank and world size, its environment view and the
    process's environment (where it still holds the old place) and its checkpoint place follow; its
    messages to the agent keep the rank it was launched as (train/worker_link.py)."""
    old = s._place
    local_world = max(1, old.local_world_size)
    rank = first_rank + old.local_rank
    if not 0 <= rank < world_size:
        raise RuntimeError(f"in-place recovery: rank {rank} does not fit a world of {world_size}")
    new = dataclasses.replace(old, rank=rank, world_size=world_size, group_rank=first_rank // local_world)
    before = dict(zip(PLACE_VARS, _place_values(old, local_world), strict=True))
    after = dict(zip(PLACE_VARS, _place_values(new, local_world), strict=True))
    for env in (s.env, os.environ):
        for key, value in after.items():
            if env is s.env or env.get(key) == before[key]:
                env[key] = value
    s._place, s.rank, s.world_size = new, rank, world_size
    s._ckpt.move(new)


def _place_values(place: WorkerPlace, local_world: int) -> tuple[str, ...]:
    groups = str(max(1, place.world_size // local_world))
    ws = str(place.world_size)
    return (str(place.rank), ws, str(place.group_rank), groups, str(place.rank), ws)


# Any: the user's training state (torch modules, optimizers, tensors, any object)
def boundary_objects(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of the state dicts of the objects that are neither models nor optimizers (the part of a
    checkpoint's extras called ``objects``), as :func:`stalwart.train.state.capture` takes them."""

    out: dict[str, Any] = {}  # Any: the state dicts of the user's objects hold values of any type
    for key, obj in state.items():
        if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
            continue
        out[key] = copy.deepcopy(obj.state_dict() if hasattr(obj, "state_dict") else obj)
    return out


def rng_dir(mem_dir: str, run_dir: Path | None) -> Path:
    """Where a rank's RNG records go: the node's memory directory, else the run's control directory."""
    if mem_dir:
        return Path(mem_dir)
    return (run_dir / "control") if run_dir is not None else Path(os.getcwd())
