"""The few collectives the engine needs, on its own process group (no-ops at world size 1).

The engine uses a dedicated gloo group so that its background persist never interleaves with
the training loop's collectives on the default group. What ranks exchange is JSON over tensor
collectives (protocol/json_collective.py), never pickled objects: callers turn their records into
JSON and back, and a peer that sends anything else is a PeerDataError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from ..errors import CheckpointError
from ..protocol.json_collective import JSON, PeerDataError, all_gather_json, broadcast_json, decode, encode

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

T = TypeVar("T")


def _typed(value: JSON, kind: type[T], rank: int) -> T:
    """``value`` if it is a ``kind`` (as rank ``rank`` sent it), else PeerDataError."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise PeerDataError(f"rank {rank} sent a {type(value).__name__} where a {kind.__name__} belongs")
    return value


class Collective:
    def __init__(self, world_size: int, group: ProcessGroup | None = None) -> None:
        self.world_size = world_size
        self.group = group

    @classmethod
    def create(cls, world_size: int, group: ProcessGroup | None = None) -> Collective:
        if world_size <= 1:
            return cls(1, None)
        import torch.distributed as dist  # deferred: heavy (torch)

        if not (dist.is_available() and dist.is_initialized()):
            raise CheckpointError(
                f"world_size={world_size} but torch.distributed is not initialized",
                "call init_process_group before creating the checkpoint engine",
            )
        return cls(world_size, group if group is not None else dist.new_group(backend="gloo"))

    def all_gather(self, value: JSON) -> list[JSON]:
        """Every rank's JSON ``value`` in rank order, over tensors (nothing is unpickled). At world
        size 1 the value still goes through JSON, so callers see the same types at every size."""
        if self.world_size <= 1:
            return [decode(encode(value), 0)]
        return all_gather_json(value, self.group)

    def broadcast(self, value: JSON) -> JSON:
        """Rank 0's JSON ``value`` on every rank, over tensors (nothing is unpickled)."""
        if self.world_size <= 1:
            return decode(encode(value), 0)
        return broadcast_json(value, 0, self.group)

    def all_gather_str(self, value: str) -> list[str]:
        return [_typed(v, str, r) for r, v in enumerate(self.all_gather(value))]

    def all_gather_bool(self, value: bool) -> list[bool]:
        return [_typed(v, bool, r) for r, v in enumerate(self.all_gather(value))]

    def broadcast_str(self, value: str) -> str:
        return _typed(self.broadcast(value), str, 0)

    def broadcast_outcome(self, ok: bool, reason: str) -> tuple[bool, str]:
        """Rank 0's (ok, reason) on every rank."""
        got = self.broadcast([ok, reason])
        if not (isinstance(got, list) and len(got) == 2):
            raise PeerDataError("rank 0 sent a malformed outcome")
        return _typed(got[0], bool, 0), _typed(got[1], str, 0)

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist  # deferred: heavy (torch)

            dist.barrier(group=self.group)

    def any_default_group(self, flag: bool) -> bool:
        """OR of a flag over all ranks on the default group (used from the training thread)."""
        if self.world_size <= 1:
            return flag
        import torch  # deferred: heavy (torch)
        import torch.distributed as dist  # deferred: heavy (torch)

        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
