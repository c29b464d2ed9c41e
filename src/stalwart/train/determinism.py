"""Bit-exact gradient reduction for DDP, independent of bucket layout.

DDP rebuilds its gradient buckets after the first iteration, in the order gradients became
ready. A resumed process runs its first iteration with the initial layout, so a ring all-reduce
adds each element's contributions in a different order than an uninterrupted run did, and the
result differs in the last bits. This hook gathers every rank's bucket and adds them in rank
order, so each element's sum is the same whatever the layout: resumed runs stay bit-identical.
It costs world-size times the memory traffic of a ring all-reduce, so use it where exactness
matters (tests, debugging, small models), not at scale.
"""

import torch
import torch.distributed as dist


def rank_ordered_allreduce_hook(process_group, bucket) -> torch.futures.Future[torch.Tensor]:
    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    flat = bucket.buffer()
    parts = [torch.empty_like(flat) for _ in range(world)]
    work = dist.all_gather(parts, flat, group=group, async_op=True)

    def reduce(fut: torch.futures.Future) -> torch.Tensor:
        fut.wait()  # ``parts`` is filled once the gather is done
        total = parts[0].clone()
        for t in parts[1:]:
            total += t
        total /= world
        flat.copy_(total)
        return flat

    return work.get_future().then(reduce)
