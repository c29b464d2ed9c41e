"""A sharded step's commit: every rank's update lands only once every rank's gradients are reduced.

With HSDP each shard position reduces its gradients over its own replica group, so when a node dies
in the middle of a step, the shards whose reduction completed can take the step while the others
cannot: the survivors then hold the model at two steps, split by shard, and no step has every shard
(the in-place recovery had to fall back to a checkpoint). A one-element all-reduce over the whole
group just before the optimizer's update closes that: no rank's update runs until every rank reached
its own, so every rank's gradients are final.

The commit can itself fail part way: some ranks see it complete and update, the others see the
connection drop. A rank that sees it fail still holds final gradients, but cannot know whether any
peer updated. It keeps a copy of its state from before the update (``keep_before``, on the failure
path only: nothing is copied on a healthy step) and lets the update land, so it holds both steps and
the re-formed group resumes at whichever one every shard is held at (train/live_state.py). At most
one such copy is kept per generation: a second failed commit is raised as it is.

Registered with the optimizer's public step pre-hook, only for a state with sharded tensors (DTensors
with a ``Shard`` placement) and one optimizer, and only when every rank's state is so (agreed by one
all-reduce at each generation's start); a DDP group needs no commit (every rank's gradients are
reduced in one collective, so a survivor ahead is only ever ahead for every shard). Every rank must
step that optimizer once per step, as data parallelism does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from ..protocol.json_collective import device_for
from .inplace import is_comm_failure


# Any: the user's training state (torch modules, optimizers, tensors, any object)
def needs_commit(state: dict[str, Any]) -> torch.optim.Optimizer | None:
    """The optimizer to commit the steps of: the state's only optimizer when some model in it holds
    sharded parameters; None otherwise (no commit)."""
    from torch.distributed.tensor import DTensor  # deferred: heavy (torch)

    opts = [v for v in state.values() if isinstance(v, torch.optim.Optimizer)]
    models = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    sharded = any(
        isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements)
        for m in models
        for p in m.parameters()
    )
    return opts[0] if sharded and len(opts) == 1 else None


@dataclass
class StepCommit:
    """``keep_before()`` is called when a commit failed; True: a copy of the state before this step's
    update was kept, so the update may land; False: the failure is raised."""

    keep_before: Callable[[], bool]
    _handle: RemovableHandle | None = None
    _flag: torch.Tensor | None = field(default=None, repr=False)

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def attach(self, state: dict[str, Any]) -> bool:
        """Collective: commit the steps of this state's optimizer (a new generation's objects) when
        every rank's state needs it; True when it does."""
        self.detach()
        opt = needs_commit(state)
        device = device_for(dist.get_backend())
        # collective: every rank commits or none does (a rank committing alone would wait forever)
        every = torch.tensor([0 if opt is None else 1], device=device)
        dist.all_reduce(every, op=dist.ReduceOp.MIN)
        if opt is None or not int(every.item()):
            return False
        self._flag = torch.zeros(1, device=device)
        self._handle = opt.register_step_pre_hook(self._before_update)
        return True

    # Any: the optimizer's step arguments, as torch's pre-hook passes them (unused)
    def _before_update(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        assert self._flag is not None
        try:
            dist.all_reduce(self._flag)
        except Exception as exc:
            if not is_comm_failure(exc) or not self.keep_before():
                raise

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle = self._flag = None
