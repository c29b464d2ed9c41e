"""Hugging Face integration: a ``transformers.TrainerCallback`` (install the ``hf`` extra).

    cb = StalwartCallback()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[cb])
    trainer.train(resume_from_checkpoint=cb.resume_path(args.output_dir))   # None on a fresh start

Under ``stalwart run`` the callback reports every optimizer step (sections ``forward_backward`` and
``optimizer``: the Trainer exposes no boundary between forward and backward) as heartbeats and
timings, beats on every evaluation batch so a long evaluation is not taken for a hang, lets chaos
faults fire at step boundaries, books the Trainer's own checkpoints (``save_steps``) in the ledger,
and on SIGTERM/SIGUSR1 to the agent makes every rank save a checkpoint after the same step and exit
with code 76. Resume is the Trainer's: ``resume_from_checkpoint``; ``resume_path`` only skips a
checkpoint directory that a crash left without its ``trainer_state.json`` (written last). When a
peer's failure breaks the group (one node), each survivor leaves a ``checkpoint-N`` of the last
completed step in node memory on its way out, and ``resume_path`` hands the restarted group that
instead of the older checkpoint: at most the interrupted step is redone (hf_left.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("stalwart.integrations.hf needs transformers: pip install 'stalwart[hf]'") from exc

from ..events import LEFT_IN_MEMORY
from ..exit_codes import EXIT_PREEMPTED
from .hf_left import HfLeft
from .hf_left import applies as left_applies
from .hf_left import arm as left_arm
from .link import EVALUATION, StepLink

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_COMPLETE_MARK = "trainer_state.json"  # the Trainer writes it after model, optimizer and RNG state


def resume_path(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest complete ``checkpoint-N`` directory under ``output_dir``, or None."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = []
    for p in root.iterdir():
        m = _CHECKPOINT.match(p.name)
        if m and p.is_dir() and (p / _COMPLETE_MARK).is_file():
            found.append((int(m.group(1)), p))
    return str(max(found)[1]) if found else None


class StalwartCallback(TrainerCallback):
    def __init__(self, link: StepLink | None = None) -> None:
        self.link = link or StepLink()
        self.preempted = False
        self._save_t0: float | None = None
        self._left: HfLeft | None = None  # the live state left on a peer's failure (hf_left.py)
        self._armed = False

    def resume_path(self, output_dir: str | os.PathLike[str]) -> str | None:
        """Where ``trainer.train(resume_from_checkpoint=...)`` resumes: the state the survivors of a
        peer's failure left in node memory when it is newer than the newest complete ``checkpoint-N``
        under ``output_dir``, else that checkpoint, or None."""
        newest = resume_path(output_dir)
        left = self._arm()
        if left is not None:
            got = left.resume(int(Path(newest).name.split("-")[-1]) if newest else -1)
            if got is not None:
                return str(got.path)
        return newest

    def _arm(self) -> HfLeft | None:
        if not self._armed:
            self._armed = True
            self._left = left_arm(self.link)
        return self._left

    # Any: TrainingArguments types output_dir as optional; the Trainer has set it before any hook
    def on_train_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.link.reclaim_signals()
        ckpt = kwargs.get("resume_from_checkpoint") or ""
        if not ckpt and state.global_step > 0:
            ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        left = self._arm()
        if left is not None and (why := left_applies(args)):
            self.link.note(f"StalwartCallback: no live state is left on a peer's failure: {why}")
            left.close()
            left = self._left = None
        if left is not None:
            left.chain()
            # the Trainer hands the callbacks no resume path: its step says which state it loaded
            if left.resumed is not None and state.global_step == left.resumed.step:
                ckpt = f"live:rank{left.resumed.source}{LEFT_IN_MEMORY}"
        total = int(state.max_steps or 0)
        self.link.started(state.global_step, total, from_checkpoint=str(ckpt), leaves_state=left is not None)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if self._left is not None and (why := self._left.step_began(state.global_step)):
            self.link.note(
                f"rank {self.link.rank}: {why}; its random streams differ from an uninterrupted run"
            )
        self.link.begin_step(state.global_step)
        self.link.section_begin("forward_backward")

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.link.section_begin("optimizer")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.link.end_step(state.global_step - 1)
        if self._left is not None:
            self._left.step_ended(
                state, kwargs.get("model"), kwargs.get("optimizer"), kwargs.get("lr_scheduler")
            )
        if not self.preempted and self.link.stop_requested():
            self.preempted = True
            control.should_training_stop = True
            if self.link.last_saved != self.link.completed:
                control.should_save = True
        if control.should_save:
            self._save_t0 = self.link.checkpoint_begin()

    # Any: TrainingArguments types output_dir as optional; the Trainer has set it before any hook
    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: object) -> None:
        t0 = self._save_t0 if self._save_t0 is not None else self.link.checkpoint_begin()
        self._save_t0 = None
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.link.checkpoint_end(t0, path, emergency=self.preempted)

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.link.beat(EVALUATION)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.link.beat(EVALUATION)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self.link.finish(preempted=self.preempted)
        if self._left is not None:
            self._left.close()
        if self.preempted:
            raise SystemExit(EXIT_PREEMPTED)
