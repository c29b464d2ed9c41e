"""The few collectives the engine needs, on its own process group (no-ops at world size 1).

The engine uses a dedicated gloo group so that its background persist never interleaves with
the training loop's collectives on the default group.
"""

from __future__ import annotations

from typing import Any


class Collective:
    def __init__(self, world_size: int, group: Any = None) -> None:
        self.world_size = world_size
        self.group = group

    @classmethod
    def create(cls, world_size: int, group: Any = None) -> Collective:
        if world_size <= 1:
            return cls(1, None)
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            from ..errors import CheckpointError

            raise CheckpointError(
                f"world_size={world_size} but torch.distributed is not initialized",
                "call init_process_group before creating the checkpoint engine",
            )
        return cls(world_size, group if group is not None else dist.new_group(backend="gloo"))

    def all_gather(self, obj: Any) -> list[Any]:
        if self.world_size <= 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        if self.world_size <= 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def any_default_group(self, flag: bool) -> bool:
        """OR of a flag over all ranks on the default group (used from the training thread)."""
        if self.world_size <= 1:
            return flag
        import torch
        import torch.distributed as dist

        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
