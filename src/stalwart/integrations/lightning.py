"""Lightning integration: ``StalwartCallback`` (install the ``lightning`` extra).

    cb = StalwartCallback(checkpoint_every=50)
    trainer = lightning.Trainer(max_steps=1000, callbacks=[cb])
    trainer.fit(model, data, ckpt_path=cb.resume_path())   # None on a fresh start

Under ``stalwart run`` the callback reports every optimizer step (with ``forward``, ``backward`` and
``optimizer`` sections) as heartbeats and timings, beats through validation so a long evaluation is
not taken for a hang, lets chaos faults fire at step boundaries, saves Lightning's own full checkpoint
every ``checkpoint_every`` steps (written to a temporary name and renamed, so a crash mid-write never
leaves a checkpoint that looks complete), and on SIGTERM/SIGUSR1 to the agent stops every rank after
the same step with an emergency checkpoint and exit code 76. Resume is Lightning's: ``ckpt_path``.
When a peer's failure breaks the group (one node, DDP), each survivor leaves Lightning's checkpoint of
the last completed step in node memory on its way out, and ``resume_path()`` hands the restarted group
that instead of the older checkpoint: at most the interrupted step is redone (lightning_left.py).

Exact resume: the callback's own state in Lightning's checkpoint holds every rank's RNG (Python,
numpy, torch CPU and CUDA), gathered from all ranks at each save. On resume each rank restores its
own as soon as Lightning hands the state back (before the loaders' iterators draw their seeds), and
again at its first training batch; an uninterrupted run does the same at the first batch after each
save, so draws made between a save and the next batch (a validation loader's seed, a resumed
iterator's seed) never shift the training step's random stream in one run and not in the other. The data position is Lightning's: a loader with
``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``) resumes mid-epoch; a plain
``DataLoader`` only at an epoch boundary, and the callback says so once at start (docs/integrations.md).
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "stalwart.integrations.lightning needs Lightning: pip install 'stalwart[lightning]'"
    ) from exc

from ..events import LEFT_IN_MEMORY
from ..exit_codes import EXIT_PREEMPTED
from ..protocol.json_collective import JSON, PeerDataError, all_gather_json
from ..train import rng
from .lightning_left import LeftCheckpoint
from .lightning_left import applies as left_applies
from .lightning_left import arm as left_arm
from .link import EVALUATION, StepLink

if TYPE_CHECKING:
    import lightning.pytorch as pl

_PREFIX, _SUFFIX = "step-", ".ckpt"


# Any: an RNG state (random, numpy and torch each take their own type back)
def _peer_rng(value: JSON, rank: int) -> dict[str, Any]:
    try:
        return rng.from_json(value)
    except ValueError as exc:
        raise PeerDataError(f"rank {rank} sent a malformed RNG state: {exc}") from None


class StalwartCallback(Callback):
    def __init__(
        self,
        checkpoint_every: int = 0,
        *,
        dirpath: str | os.PathLike[str] | None = None,
        keep: int = 2,
        link: StepLink | None = None,
    ) -> None:
        if checkpoint_every < 0 or keep < 1:
            raise ValueError("checkpoint_every must be >= 0 and keep >= 1")
        self.link = link or StepLink()
        self.every = checkpoint_every
        self.keep = keep
        self.dirpath = Path(dirpath) if dirpath is not None else self.link.checkpoint_dir("lightning")
        self.preempted = False
        # Any: an RNG state (random, numpy and torch each take their own type back)
        self._rng_to_restore: dict[str, Any] | None = None
        # the live state left on a peer's failure (lightning_left.py)
        self._left: LeftCheckpoint | None = None
        self._left_armed = False
        self._leaving = False  # writing the left checkpoint: no collective in state_dict

    # --- the callback's state in Lightning's checkpoint: every rank's RNG -----------------------

    # Any: Lightning's Callback.state_dict/load_state_dict signatures
    def state_dict(self) -> dict[str, Any]:
        """Every rank's RNG states (Lightning calls this on every rank while saving; rank 0 writes).
        Nothing in the checkpoint a rank leaves on its way out (no collective then: the group is
        broken); its RNG is in its record of the step (lightning_left.py)."""
        if self._leaving:
            return {}
        mine = rng.capture()
        self._rng_to_restore = mine  # the next batch starts from it, as a resumed run's does
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # JSON over tensors: a rank's state is data, never an object to unpickle
            every = [_peer_rng(v, r) for r, v in enumerate(all_gather_json(rng.to_json(mine)))]
        else:
            every = [mine]
        return {"rng_per_rank": every}

    # Any: Lightning's Callback.state_dict/load_state_dict signatures
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        every = state_dict.get("rng_per_rank") or []
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        if len(every) == world:
            self._rng_to_restore = every[self.link.rank if world > 1 else 0]
            rng.restore(self._rng_to_restore)  # before the resumed loaders draw their seeds
        elif every:
            warnings.warn(
                f"the checkpoint holds the RNG states of {len(every)} ranks, this run has {world}: "
                "random draws (dropout, augmentation) after resume differ from an uninterrupted run",
                stacklevel=2,
            )

    # --- resume -------------------------------------------------------------------------------

    def resume_path(self) -> str | None:
        """Where ``trainer.fit(ckpt_path=...)`` resumes: the live state the survivors of a peer's
        failure left in node memory when it is newer than the newest complete checkpoint of this run
        (lightning_left.py), else that checkpoint, or None."""
        found = _checkpoints(self.dirpath)
        left = self._arm()
        if left is not None:
            got = left.resume(_step(found[-1]) if found else -1)
            if got is not None:
                return str(got.path)
        return str(found[-1]) if found else None

    def _arm(self) -> LeftCheckpoint | None:
        if not self._left_armed:
            self._left_armed = True
            self._left = left_arm(self.link)
        return self._left

    def _take_left(self, trainer: pl.Trainer) -> str:
        """At train start (every rank, once the checkpoint was loaded): whether it applies here; on a
        resume from a left file, this rank's RNG record of that step; then the files go, after every
        rank loaded its own. What ``TrainingResumed.from_checkpoint`` says."""
        source = str(trainer.ckpt_path or "")
        left = self._arm()
        if left is None:
            return source
        why = left_applies(trainer)
        if why:
            self.link.note(f"StalwartCallback: no live state is left on a peer's failure: {why}")
            left.close()
            self._left = None
            return source
        got = left.resumed
        if got is not None and source and Path(source) == got.path:
            failed = left.restore_rng()
            if failed:
                self.link.note(
                    f"rank {self.link.rank}: {failed}; its random streams differ from an uninterrupted run"
                )
            else:
                self._rng_to_restore = rng.capture()  # again at the epoch's and the first batch's start
            source = f"live:rank{got.source}{LEFT_IN_MEMORY}"
        trainer.strategy.barrier("stalwart-left-state")  # every rank loaded its file: remove them
        left.forget()
        return source

    # --- the loop -----------------------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.link.reclaim_signals()  # Lightning's own SIGTERM handler would exit without a checkpoint
        total = (
            trainer.max_steps
            if trainer.max_steps and trainer.max_steps > 0
            else trainer.estimated_stepping_batches
        )
        total = int(total) if total is not None and math.isfinite(total) else 0
        source = self._take_left(trainer)
        self.link.started(
            trainer.global_step, total, from_checkpoint=source, leaves_state=self._left is not None
        )
        if trainer.is_global_zero and not _resumable(trainer.train_dataloader):
            warnings.warn(_position_warning(trainer), stacklevel=2)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._rng_to_restore is not None:  # a new epoch's loader draws its seeds from the saved state,
            rng.restore(self._rng_to_restore)  # as a run resumed at this epoch boundary does

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        if self._rng_to_restore is not None:  # the first batch after a save or a resume
            rng.restore(self._rng_to_restore)
            self._rng_to_restore = None
        if self._left is not None:
            self._left.batch_began(trainer.global_step)
        self.link.begin_step(trainer.global_step)
        self.link.section_begin("forward")

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        self.link.section_begin("backward")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.link.section_begin("optimizer")

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        self.link.end_step(trainer.global_step - 1)
        done = self.link.completed
        stop = not self.preempted and self.link.stop_requested()
        if stop:  # the emergency save (also when a regular one is due now: one save, reported as such)
            self._save(trainer, emergency=True)
            self.preempted = True
            trainer.should_stop = True
        elif self.every and done % self.every == 0:
            self._save(trainer, emergency=False)
        if self._left is not None:
            self._left.batch_ended(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """A peer's failure broke the group: leave the state after the last completed step."""
        if self._left is None:
            return
        self._leaving = True
        try:
            why = self._left.leave(trainer, exception)
        finally:
            self._leaving = False
        if why:
            self.link.note(why)

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: object,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.link.beat(EVALUATION)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.link.beat(EVALUATION)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.link.finish(preempted=self.preempted)
        if self.preempted:
            raise SystemExit(EXIT_PREEMPTED)

    # --- checkpoints --------------------------------------------------------------------------

    def _save(self, trainer: pl.Trainer, *, emergency: bool) -> None:
        t0 = self.link.checkpoint_begin()
        final = self.dirpath / f"{_PREFIX}{self.link.completed:08d}{_SUFFIX}"
        partial = final.with_name(final.name + ".partial")
        # every rank calls it; rank 0 writes; ends in a barrier. The full state (optimizer, loops,
        # callbacks: our RNG and data position), said explicitly as Lightning asks
        trainer.save_checkpoint(str(partial), weights_only=False)
        if trainer.is_global_zero:
            os.replace(partial, final)  # visible only when complete
            for old in _checkpoints(self.dirpath)[: -self.keep]:
                old.unlink(missing_ok=True)
        self.link.checkpoint_end(t0, final, emergency=emergency)


EXACT_FIX = (
    "to resume exactly, train from torchdata's StatefulDataLoader over "
    "stalwart.integrations.resumable_sampler.ResumableDistributedSampler (with "
    "Trainer(use_distributed_sampler=False)), or save only at epoch ends"
)


def _position_warning(trainer: pl.Trainer) -> str:
    """What a training loader without ``state_dict`` changes, said precisely: on a resume in the
    middle of an epoch, Lightning goes on at the saved batch index but draws the rest of the epoch
    from the start of a new pass over the loader (measured with Lightning 2.6: the saved run's
    batches ``k..N-1`` of that epoch are replaced by the new pass's first ``N-k``)."""
    head = "StalwartCallback: the training DataLoader has no state_dict/load_state_dict"
    batches = trainer.num_training_batches
    per_epoch = math.ceil(batches / max(1, trainer.accumulate_grad_batches)) if math.isfinite(batches) else 0
    step = int(trainer.global_step)
    if not per_epoch:
        return f"{head}: a resume in the middle of an epoch starts the loader over; {EXACT_FIX}"
    epoch, k = divmod(step, per_epoch)
    if step == 0 or k == 0:
        return (
            f"{head}: a checkpoint saved in the middle of an epoch (an emergency save, or "
            f"checkpoint_every not a multiple of the epoch's {per_epoch} steps) would resume at another "
            f"data position than an uninterrupted run; {EXACT_FIX} (checkpoint_every a multiple of {per_epoch})"
        )
    return (
        f"{head}: resumed at step {step}, batch {k} of epoch {epoch} ({per_epoch} an epoch); the "
        f"rest of epoch {epoch} (its batches {k}-{per_epoch - 1}) comes from the start of a new pass "
        f"over the loader, not from where the saved run stopped, so some of that epoch's samples are "
        f"trained twice and others not at all, and the weights differ from an uninterrupted run; "
        f"{EXACT_FIX} (checkpoint_every a multiple of {per_epoch})"
    )


def _resumable(loaders: object) -> bool:
    """Whether every training loader can save and restore its position (Lightning's test)."""
    flat = getattr(loaders, "flattened", None)
    items = flat if flat is not None else (loaders if isinstance(loaders, list | tuple) else [loaders])
    return all(hasattr(x, "state_dict") and hasattr(x, "load_state_dict") for x in items if x is not None)


def _step(path: Path) -> int:
    return int(path.name[len(_PREFIX) : -len(_SUFFIX)])


def _checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = []
    for p in directory.glob(f"{_PREFIX}*{_SUFFIX}"):
        digits = p.name[len(_PREFIX) : -len(_SUFFIX)]
        if digits.isdigit():
            found.append((int(digits), p))
    return [p for _, p in sorted(found)]
