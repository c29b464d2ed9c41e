"""Exactly-once data across crashes, requeues and world-size changes: an elastic, stateful sampler.

Use it as the sampler of torchdata's ``StatefulDataLoader`` and put the loader into the SDK's
state (``state = {..., "data": loader}``); the loader's ``state_dict`` carries this sampler's
state into every checkpoint::

    sampler = ElasticDistributedSampler(len(dataset), rank=session.rank, world_size=session.world_size, seed=7)
    loader = StatefulDataLoader(dataset, batch_size=8, sampler=sampler)

Each epoch is one seeded permutation of the whole dataset. The state is global, not per rank:
``{"epoch", "consumed"}`` where ``consumed`` counts the samples of the epoch taken by *all* ranks
(ranks advance in lockstep: rank ``r`` takes positions ``r, r + W, r + 2W, ...`` of what is
left). Loading the state at another world size partitions the unseen remainder of the
permutation over the new ranks, so every sample of the epoch is consumed once.

Not exact: a rank that has taken fewer samples than the others when the state is saved (an
uneven last batch) makes ``consumed`` an over-count; keep per-rank batch counts equal (or use
``drop_last=True``, which leaves the tail of each epoch unseen, never duplicated).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..errors import CheckpointError


class ElasticDistributedSampler(torch.utils.data.Sampler[int]):
    """Seeded global permutation per epoch, partitioned over ranks; resumes at any world size."""

    def __init__(
        self,
        num_samples: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        if num_samples < 0 or world_size < 1 or not 0 <= rank < world_size:
            raise CheckpointError(
                f"invalid sampler layout: num_samples={num_samples}, rank={rank}, world_size={world_size}",
                "use 0 <= rank < world_size and num_samples >= 0",
            )
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.start = 0  # global position where this rank's current pass began
        self.yielded = 0  # samples this rank took since ``start``
        self._pending: int | None = None  # a loaded position, used by the next __iter__

    def permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=g).tolist()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (unless a loaded position for it is pending)."""
        if self._pending is None or epoch != self.epoch:
            self._pending = None
            self.epoch = epoch
            self.start = self.yielded = 0

    @property
    def consumed(self) -> int:
        """Samples of this epoch taken by all ranks together (ranks in lockstep)."""
        return min(self.num_samples, self.start + self.yielded * self.world_size)

    def _mine(self, start: int) -> list[int]:
        rest = self.permutation(self.epoch)[start:]
        if self.drop_last:
            rest = rest[: len(rest) - len(rest) % self.world_size]
        return rest[self.rank :: self.world_size]

    def __len__(self) -> int:
        return len(self._mine(self._pending if self._pending is not None else self.start))

    def __iter__(self) -> Iterator[int]:
        if self._pending is not None:
            self.start, self._pending = self._pending, None
        else:
            self.start = 0
        self.yielded = 0
        for idx in self._mine(self.start):
            self.yielded += 1
            yield idx

    def state_dict(self) -> dict[str, Any]:  # Any: torchdata StatefulDataLoader's state_dict
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "num_samples": self.num_samples,
            "seed": self.seed,
        }

    # Any: torchdata StatefulDataLoader's state_dict
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (
            int(state.get("num_samples", self.num_samples)) != self.num_samples
            or int(state.get("seed", self.seed)) != self.seed
        ):
            raise CheckpointError(
                f"data position was saved for {state.get('num_samples')} samples with seed "
                f"{state.get('seed')}, this sampler has {self.num_samples} with seed {self.seed}",
                "resume with the same dataset and sampler seed",
            )
        self.epoch = int(state["epoch"])
        self._pending = int(state["consumed"])
        self.start, self.yielded = self._pending, 0
