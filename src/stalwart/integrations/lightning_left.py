"""Live state for a Lightning run: what a surviving rank leaves in its node's memory on the way out,
and the checkpoint path the restarted group resumes from instead of rolling back (docs/integrations.md).

Lightning owns its loop, so when a peer dies the survivors' ``fit`` fails with the broken group's
communication error and the agent restarts the whole group warm. Without this module that resumed
from the newest checkpoint although every survivor held the state of the last completed step. Now,
as the loop idiom does (train/left_state.py), in Lightning's own terms:

1. at every batch start a rank records its RNG streams (train/live_rng.py: the file a rank that died
   cannot take with it); at every batch end where an optimizer stepped (the point where the callback
   saves its checkpoints) it records the part of Lightning's checkpoint that moves on before the next
   step's optimizer does: the loops' state (the data position included) and the LR schedulers';
2. when a communication failure reaches the callback's ``on_exception``, the rank writes Lightning's
   own checkpoint of that moment with those parts taken from the record: the models and optimizers
   are still at the last completed step as long as no optimizer stepped since (a global optimizer step
   hook says so; a rank whose optimizer stepped leaves nothing). It is written 0600 under a temporary
   name in the node's private memory directory and renamed, named by its step;
3. the restarted group's ``resume_path()`` returns the newest such file when it is newer than the
   newest checkpoint: the lowest step any rank left (every rank must resume at the same step), this
   rank's own file when it holds that step, else the file of the lowest rank that does (DDP replicas
   are identical). At the first batch each rank restores its RNG record of that step, so the run goes
   on as if uninterrupted. After every rank loaded it, the files are removed.

Where it does not apply (nothing is left, the checkpoint decides as before): more than one node (the
ranks of a node that died with all its ranks would find no file, and the nodes could not agree on a
step before ``fit`` forms the group), strategies other than DDP or one device (sharded state is held
by nobody whole), a Lightning without the checkpoint connector this uses, ``--no-leave-state``.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..train.left_state import _opener  # the loop idiom's: 0600, no link followed
from ..train.live_rng import path_for, restore_at
from .left_files import Left, Names, RankLeft, place

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from .link import StepLink

NAMES = Names("lightning-left-", ".ckpt")
STRATEGIES = ("DDPStrategy", "SingleDeviceStrategy")  # replicated state: one rank's file serves all


class LeftCheckpoint(RankLeft):
    """One rank's side: records at batch starts and ends, leaves the checkpoint, picks it back up."""

    names = NAMES

    def __init__(self, directory: Path, node: str, rank: int, local_rank: int, attempt: int) -> None:
        super().__init__(directory, node, rank, local_rank, attempt)
        # Any: Lightning's checkpoint entries (loops' and schedulers' state dicts) at the last step end
        self.boundary: dict[str, Any] | None = None
        self._rng_step = -1  # the step whose RNG record was written (its first batch's)

    def batch_began(self, step: int) -> None:
        """At the first batch of each optimizer step: this rank's RNG streams as the step starts."""
        if step != self._rng_step:
            self.rng.write(step)
            self._rng_step = step

    def batch_ended(self, trainer: pl.Trainer) -> None:
        """After a batch whose optimizer stepped (gradient accumulation: not after the others, whose
        gradients no checkpoint holds): the entries that move on before the next optimizer step."""
        if not self.updates.landed():
            return
        connector = trainer._checkpoint_connector
        self.boundary = {
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "loops": copy.deepcopy(connector._get_loops_state_dict()),
            "lr_schedulers": [copy.deepcopy(c.scheduler.state_dict()) for c in trainer.lr_scheduler_configs],
        }
        self.updates.boundary()

    def leave(self, trainer: pl.Trainer, exc: BaseException) -> str:
        """From ``on_exception``: write the checkpoint after the last completed step when ``exc`` is a
        peer's failure; "" when written or not wanted, else why not (never raises)."""
        why = self.why_not(exc, self.boundary is not None)
        if why is not None:
            return why
        assert self.boundary is not None
        step = int(self.boundary["global_step"])
        path = NAMES.path(self.directory, self.node, self.rank, step, self.attempt)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            ckpt = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            ckpt.update(self.boundary)
            with open(tmp, "wb", opener=_opener) as f:
                torch.save(ckpt, f)
            os.replace(tmp, path)
        except Exception as exc2:  # noqa: BLE001 - the process is ending anyway: say why, leave nothing
            tmp.unlink(missing_ok=True)
            return f"rank {self.rank} could not leave its state ({type(exc2).__name__}: {exc2})"
        return ""

    def restore_rng(self) -> str:
        """This rank's RNG record at the resumed step, set now; "" on success, else why not."""
        assert self.resumed is not None
        return restore_at(path_for(self.directory, self.node, self.rank), self.resumed.step)


def arm(link: StepLink) -> LeftCheckpoint | None:
    """This rank's left state, or None where it does not apply (left_files.py :func:`place`)."""
    at = place(link)
    return None if at is None else LeftCheckpoint(at.directory, at.node, at.rank, at.local_rank, at.attempt)


def applies(trainer: pl.Trainer) -> str:
    """ "" when this trainer's state can be left whole, else why not (said once, at train start)."""
    name = type(trainer.strategy).__name__
    if name not in STRATEGIES:
        return f"the {name} strategy's state is sharded or not replicated"
    connector = getattr(trainer, "_checkpoint_connector", None)
    if (
        connector is None
        or not hasattr(connector, "dump_checkpoint")
        or not hasattr(connector, "_get_loops_state_dict")
    ):
        return "this Lightning has no checkpoint connector with dump_checkpoint and _get_loops_state_dict"
    return ""


__all__ = ["NAMES", "Left", "LeftCheckpoint", "applies", "arm"]
