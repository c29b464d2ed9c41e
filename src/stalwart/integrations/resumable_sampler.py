"""A distributed sampler whose position includes its epoch, for exact mid-epoch resume.

torch's ``DistributedSampler`` shuffles by ``seed + epoch``, and a stateful loader (torchdata's
``StatefulDataLoader``) resumes it by skipping the samples already yielded. But a framework that
re-creates the loader's iterator on resume before it calls ``set_epoch`` (Lightning does) skips into
epoch 0's permutation: the rest of the epoch trains on other samples. This sampler's iterator keeps
``{"epoch", "yielded"}`` as its state, so the loader restores the right permutation and position
whatever the order of those calls. Use it with ``use_distributed_sampler=False`` in Lightning.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data.distributed import DistributedSampler

__all__ = ["ResumableDistributedSampler"]


class ResumableDistributedSampler(DistributedSampler):
    def __iter__(self) -> Iterator[int]:
        return _Position(self)


class _Position(Iterator[int]):
    """One epoch of a :class:`ResumableDistributedSampler`: a stateful iterator (torchdata's test)."""

    def __init__(self, sampler: ResumableDistributedSampler) -> None:
        self.sampler = sampler
        self.epoch = sampler.epoch
        self.yielded = 0
        self._indices: list[int] | None = None

    def __iter__(self) -> _Position:
        return self

    def __next__(self) -> int:
        if self._indices is None:
            current, self.sampler.epoch = self.sampler.epoch, self.epoch
            try:
                self._indices = list(DistributedSampler.__iter__(self.sampler))
            finally:
                self.sampler.epoch = current
        if self.yielded >= len(self._indices):
            raise StopIteration
        self.yielded += 1
        return self._indices[self.yielded - 1]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    # Any: torchdata hands back the state it saved (a dict read from a checkpoint)
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.yielded, self._indices = int(state["epoch"]), int(state["yielded"]), None
