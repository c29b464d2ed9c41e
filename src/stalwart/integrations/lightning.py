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
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "stalwart.integrations.lightning needs Lightning: pip install 'stalwart[lightning]'"
    ) from exc

from ..exit_codes import EXIT_PREEMPTED
from .link import EVALUATION, StepLink

_PREFIX, _SUFFIX = "step-", ".ckpt"


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

    # --- resume -------------------------------------------------------------------------------

    def resume_path(self) -> str | None:
        """The newest complete checkpoint of this run (for ``trainer.fit(ckpt_path=...)``), or None."""
        found = _checkpoints(self.dirpath)
        return str(found[-1]) if found else None

    # --- the loop -----------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.link.reclaim_signals()  # Lightning's own SIGTERM handler would exit without a checkpoint
        total = (
            trainer.max_steps
            if trainer.max_steps and trainer.max_steps > 0
            else trainer.estimated_stepping_batches
        )
        total = int(total) if total is not None and math.isfinite(total) else 0
        self.link.started(trainer.global_step, total, from_checkpoint=str(trainer.ckpt_path or ""))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.link.begin_step(trainer.global_step)
        self.link.section_begin("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.link.section_begin("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.link.section_begin("optimizer")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.link.end_step(trainer.global_step - 1)
        done = self.link.completed
        if self.every and done % self.every == 0:
            self._save(trainer, emergency=False)
        if not self.preempted and self.link.stop_requested():
            if self.link.last_saved != done:
                self._save(trainer, emergency=True)
            self.preempted = True
            trainer.should_stop = True

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.link.beat(EVALUATION)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.link.beat(EVALUATION)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.link.finish(preempted=self.preempted)
        if self.preempted:
            raise SystemExit(EXIT_PREEMPTED)

    # --- checkpoints --------------------------------------------------------------------------

    def _save(self, trainer: Any, *, emergency: bool) -> None:
        t0 = self.link.checkpoint_begin()
        final = self.dirpath / f"{_PREFIX}{self.link.completed:08d}{_SUFFIX}"
        partial = final.with_name(final.name + ".partial")
        trainer.save_checkpoint(str(partial))  # every rank calls it; rank 0 writes; ends in a barrier
        if trainer.is_global_zero:
            os.replace(partial, final)  # visible only when complete
            for old in _checkpoints(self.dirpath)[: -self.keep]:
                old.unlink(missing_ok=True)
        self.link.checkpoint_end(t0, final, emergency=emergency)


def _checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    found = []
    for p in directory.glob(f"{_PREFIX}*{_SUFFIX}"):
        digits = p.name[len(_PREFIX) : -len(_SUFFIX)]
        if digits.isdigit():
            found.append((int(digits), p))
    return [p for _, p in sorted(found)]
