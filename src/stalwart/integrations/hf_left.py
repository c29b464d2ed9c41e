"""Live state for a Hugging Face ``Trainer`` run: the checkpoint a surviving rank leaves in its node's
memory on the way out, and the restarted group's resume from it instead of the older ``checkpoint-N``
(docs/integrations.md).

The ``Trainer`` owns its loop, so when a peer dies the survivors' ``train`` fails with the broken
group's communication error and the agent restarts the whole group warm. As the Lightning callback's
survivors do (lightning_left.py), in the ``Trainer``'s own terms:

1. at every step end (after the optimizer and the LR scheduler stepped) a rank records the
   ``TrainerState`` (the global step, which also sets the data position: the ``Trainer`` skips the
   batches a resumed epoch already saw) and the scheduler's state; at every step's start its RNG
   streams (train/live_rng.py: the record a rank that died leaves behind too);
2. when a communication failure escapes ``train`` (the process's excepthook, chained before the
   SDK's), the rank writes a ``checkpoint-N`` directory the ``Trainer`` resumes from: the model
   (its config and its weights as safetensors), the optimizer's and the scheduler's state, and the recorded
   ``trainer_state.json`` (written last, as the ``Trainer`` does). The model and optimizer are still at
   the last completed step as long as no optimizer stepped since the record (a global optimizer step
   hook says so; a rank whose optimizer stepped leaves nothing). It is written under a temporary name
   in the node's private memory directory and renamed;
3. the restarted group's ``resume_path`` returns the newest such directory when it is newer than the
   newest ``checkpoint-N`` of the output directory (left_files.py: the lowest step any rank left, this
   rank's own when it holds it); at the first step each rank restores its own RNG record of that
   step (a rank that died is thus replaced with its own random streams); after that step (which every
   rank began from the files) they are removed.

Where it does not apply (the checkpoint decides as before): more than one node, FSDP or DeepSpeed
(sharded state), ``--no-leave-state``.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from safetensors.torch import save_model

from ..train.live_rng import path_for, restore_at
from .left_files import Left, Names, RankLeft, place
from .link import StepLink

# Any: what the excepthook that was there returns (sys.excepthook's is typed as object)
Hook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]
NAMES = Names("hf-left-")  # directories: hf-left-<node>-rank<R>-step<S>-a<attempt>
STATE_FILE = "trainer_state.json"  # written last: a directory without it is not whole


class HfLeft(RankLeft):
    """One rank's side: records at step starts and ends, leaves the checkpoint, picks it back up."""

    names = NAMES

    def __init__(
        self,
        directory: Path,
        node: str,
        rank: int,
        local_rank: int,
        attempt: int,
        note: Callable[[str], None] = lambda t: None,
    ) -> None:
        super().__init__(directory, node, rank, local_rank, attempt)
        self._note = note
        # Any: the Trainer's objects (TrainerState, the model, optimizer and scheduler), and state dicts
        self.boundary: tuple[int, Any, Any] | None = None  # (step, TrainerState copy, scheduler state)
        self.objects: tuple[Any, Any] | None = None  # (model, optimizer)
        self._restore_at: int | None = None  # the resumed step whose RNG record the first step restores
        self._prev_hook: Hook | None = None

    # --- the loop ------------------------------------------------------------------------------

    def step_began(self, step: int) -> str:
        """At a step's start: on the first step of a resume from a left state, this rank's RNG record
        of it (why not, or ""); then this step's record."""
        why = ""
        if self._restore_at is not None:
            why = restore_at(path_for(self.directory, self.node, self.rank), self._restore_at)
            self._restore_at = None
        self.rng.write(step)
        return why

    # Any: the Trainer's TrainerState, model, optimizer and scheduler
    def step_ended(self, state: Any, model: Any, optimizer: Any, scheduler: Any) -> None:
        """After the optimizer and scheduler stepped: what moves on before the next optimizer step."""
        sched = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
        self.boundary = (int(state.global_step), copy.deepcopy(state), sched)
        self.objects = (model, optimizer)
        self.updates.boundary()
        if self.resumed is not None:  # every rank began the resumed step from the files: remove them
            self.forget()
            self.resumed = None

    # --- on the way out ------------------------------------------------------------------------

    def chain(self) -> None:
        """Leave the state from the process's excepthook, before the hook that was there (the SDK's)."""
        self._prev_hook = sys.excepthook
        sys.excepthook = self._excepthook

    def _excepthook(self, etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        why = self.leave(value)
        if why:
            self._note(why)
        if self._prev_hook is not None:
            self._prev_hook(etype, value, tb)

    def leave(self, exc: BaseException) -> str:
        """Write the ``checkpoint-N`` of the last completed step when ``exc`` is a peer's failure; ""
        when written or not wanted, else why not (never raises: the process is ending anyway)."""
        why = self.why_not(exc, self.boundary is not None and self.objects is not None)
        if why is not None:
            return why
        assert self.boundary is not None and self.objects is not None
        step, state, sched = self.boundary
        model, optimizer = self.objects
        path = NAMES.path(self.directory, self.node, self.rank, step, self.attempt)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.mkdir(mode=0o700)
            # not save_pretrained: it writes on the group's rank 0 only (a survivor may be any rank)
            model.config.to_json_file(str(tmp / "config.json"))
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            if sched is not None:
                torch.save(sched, tmp / "scheduler.pt")
            state.save_to_json(str(tmp / STATE_FILE))
            os.replace(tmp, path)
        except Exception as exc2:  # noqa: BLE001 - the process is ending anyway: say why, leave nothing
            shutil.rmtree(tmp, ignore_errors=True)
            return f"rank {self.rank} could not leave its state ({type(exc2).__name__}: {exc2})"
        return ""

    # --- the restart ---------------------------------------------------------------------------

    def resume(self, newest_checkpoint: int) -> Left | None:
        """The left directory to resume from when it is newer than the newest checkpoint (its step)."""
        got = super().resume(newest_checkpoint)
        self._restore_at = got.step if got is not None else None
        return got

    def _whole(self, left: Left) -> bool:
        return (left.path / STATE_FILE).is_file()

    def close(self) -> None:
        super().close()
        if self._prev_hook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_hook


def arm(link: StepLink) -> HfLeft | None:
    """This rank's left state, or None where it does not apply (left_files.py :func:`place`)."""
    at = place(link)
    return (
        None if at is None else HfLeft(at.directory, at.node, at.rank, at.local_rank, at.attempt, link.note)
    )


# Any: TrainingArguments (its fields differ across transformers versions)
def applies(args: Any) -> str:
    """ "" when this run's state can be left whole, else why not."""
    if getattr(args, "fsdp", None) or getattr(args, "deepspeed", None):
        return "FSDP and DeepSpeed shard the state: a lost rank's shards are held by nobody"
    return ""


__all__ = ["NAMES", "HfLeft", "applies", "arm"]
