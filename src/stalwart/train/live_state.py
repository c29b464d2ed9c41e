"""Live state for a re-formed process group: which step the group resumes at, which rank gives it,
and the transfer to the ranks that lack it, verified by a digest.

After an in-place re-formation every rank has rebuilt its objects (its training function ran again),
but the survivors still hold the state of their last completed step in the objects of the previous
generation. :func:`adopt` is collective over the new group:

1. every rank contributes the step its live state is at (-1: none, a replacement) and the step of
   its copy from one step earlier, when a sharded step's commit failed (train/step_commit.py);
2. the group resumes at the lowest such step at which every rank's shards are held (the interrupted
   step is redone, exactly: see below); each rank that lacks it receives from the lowest rank
   holding it with the same shards (any rank of a DDP group; the rank at the same shard position of
   another HSDP replica group); when some rank's shards are held by no live replica (plain FSDP),
   every rank resumes from a checkpoint instead.
   After the group changed size, a survivor holds its state only where every local part sits in the
   same place of the whole (:func:`same_shards`): always for DDP, and for HSDP when the shard groups
   are unchanged (a replica group left or came back); plain FSDP over the changed world is cut anew,
   so its survivors hold nothing and the group resumes from a checkpoint;
3. a holder copies its own previous objects into the new ones (no bytes move);
4. the source sends every other rank the tensors (one flat buffer per dtype, point to point, so the
   bytes moved are the state size times the ranks that lack it, not times the world) and the plain
   extras (``torch.save`` bytes read back with ``weights_only=True``: nothing is unpickled), preceded
   by a header with the keys, shapes, dtypes and a SHA-256 digest of the tensor bytes; the receiver
   checks the layout against its own state and the digest over what it received before applying it.

RNG streams are per rank: every rank (holder or replacement) restores the record its rank left on the
node at the start of the resumed step (train/live_rng.py).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from . import state


class LiveStateError(RuntimeError):
    """The live state cannot be used (a layout or digest mismatch): fall back to the checkpoint."""


@dataclass(frozen=True)
class Held:
    """A rank's live state from the previous generation: its objects, the steps they completed and the
    state dicts of its other objects (data loader, sampler, scheduler...) as they were at the start of
    the step it was in (``boundary``): a loader has already fetched the interrupted step's batch, so its
    state at the failure would skip that batch when the step is redone. ``before``: a copy of the state
    one step earlier, kept when a sharded step's commit failed and its update landed anyway
    (train/step_commit.py), so the rank can serve either step."""

    objects: dict[str, Any]  # Any: the user's training state (torch modules, optimizers, tensors, any object)
    step: int
    boundary: dict[str, Any] | None = (
        None  # Any: the user's training state (torch modules, optimizers, tensors, any object)
    )
    before: tuple[int, state.Captured] | None = None


@dataclass(frozen=True)
class Adopted:
    step: int  # the group resumes after this many steps
    source: int  # the rank that sent the state
    received: int  # bytes this rank received
    rng_note: str  # "" when this rank's RNG stream is exact, else why not


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor (FSDP2, HSDP, TP), else the tensor."""
    from torch.distributed.tensor import DTensor  # deferred: heavy (torch)

    return t.to_local() if isinstance(t, DTensor) else t


def _shard_key(tensors: dict[str, torch.Tensor]) -> int:
    """Which part of the state this rank holds: equal on two ranks exactly when they hold the same
    shards (every rank of a DDP group; the ranks at the same shard position of different HSDP replica
    groups). From the local shapes and, for DTensors, the rank's coordinates on the sharded mesh dims."""
    from torch.distributed.tensor import DTensor  # deferred: heavy (torch)

    parts: list[object] = []
    for k in sorted(tensors):
        t = tensors[k]
        coord: tuple[int, ...] = ()
        if isinstance(t, DTensor):
            at: list[int] = list(t.device_mesh.get_coordinate() or [])
            coord = tuple(c for c, p in zip(at, t.placements, strict=False) if p.is_shard())
        parts.append((k, tuple(_local(t).shape), coord))
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little", signed=True)


def _placement(t: torch.Tensor) -> tuple[Any, ...]:  # Any: DTensor placements (torch.distributed.tensor)
    """Where a tensor's local part sits in the whole: its local shape and, for a DTensor, the rank's
    coordinates on the sharded mesh dims and those dims' sizes (a replicated dim may change size: an
    HSDP group that lost or gained a replica group keeps every rank's shards)."""
    from torch.distributed.tensor import DTensor  # deferred: heavy (torch)

    if not isinstance(t, DTensor):
        return (tuple(t.shape),)
    at = list(t.device_mesh.get_coordinate() or [])
    dims = [d for d, p in enumerate(t.placements) if p.is_shard()]
    return (
        tuple(t.to_local().shape),
        tuple(at[d] if d < len(at) else -1 for d in dims),
        tuple(t.device_mesh.size(d) for d in dims),
        tuple(str(t.placements[d]) for d in dims),
    )


def same_shards(held: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> bool:
    """Whether the state a rank held fits its new objects part for part: the same keys, and every
    tensor's local part in the same place of the whole. False when the group's change of size cut the
    shards anew (plain FSDP over the changed world): that rank then holds nothing usable."""
    return held.keys() == new.keys() and all(_placement(held[k]) == _placement(new[k]) for k in new)


def _layout(tensors: dict[str, torch.Tensor]) -> list[list[object]]:
    return [
        [k, list(_local(t).shape), str(t.dtype).removeprefix("torch.")] for k, t in sorted(tensors.items())
    ]


def _flat(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One contiguous buffer per dtype (this rank's local shards), keys in sorted order."""
    groups: dict[str, list[torch.Tensor]] = {}
    for k in sorted(tensors):
        t = _local(tensors[k])
        groups.setdefault(str(t.dtype), []).append(t.detach().reshape(-1).cpu())
    return {d: torch.cat(ts) if ts else torch.empty(0) for d, ts in sorted(groups.items())}


def _digest(buffers: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for d, buf in sorted(buffers.items()):
        h.update(d.encode())
        h.update(buf.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _send_bytes(data: bytes, dst: int) -> None:

    dist.send(torch.tensor([len(data)], dtype=torch.int64), dst)
    if data:
        dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst)


def _recv_bytes(src: int, limit: int) -> bytes:

    n = torch.zeros(1, dtype=torch.int64)
    dist.recv(n, src)
    size = int(n.item())
    if not 0 <= size <= limit:
        raise LiveStateError(f"rank {src} announced {size} bytes of state header, over the {limit} limit")
    buf = torch.empty(size, dtype=torch.uint8)
    if size:
        dist.recv(buf, src)
    return buf.numpy().tobytes()


def _gather(step: int, before: int, key: int) -> list[tuple[int, int, int]]:
    """Every rank's (live step, the step of its copy from one step earlier, shard key)."""

    mine = torch.tensor([step, before, key], dtype=torch.int64)
    out = [torch.zeros(3, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [(int(t[0].item()), int(t[1].item()), int(t[2].item())) for t in out]


def plan_sources(ranks: list[tuple[int, int, int]]) -> tuple[int, dict[int, int]] | None:
    """Pure: from every rank's (live step, step of its earlier copy, shard key), -1 for none, the step
    the group resumes at and, for each rank that lacks it, the rank it receives from (the lowest rank
    holding that step with the same shards). The lowest step at which every rank's shards are held;
    None when there is no such step (no rank holds live state, or plain FSDP across the lost rank, or
    a sharded step that landed for some shards only with no earlier copy kept): then every rank
    resumes from a checkpoint."""
    holds = [{s for s in (step, before) if s >= 0} for step, before, _ in ranks]
    for target in sorted(set().union(*holds)):
        sources: dict[int, int] = {}
        for r, (_, _, key) in enumerate(ranks):
            if target in holds[r]:
                continue
            src = next((h for h, (_, _, k) in enumerate(ranks) if k == key and target in holds[h]), None)
            if src is None:
                break
            sources[r] = src
        else:
            return target, sources
    return None


@dataclass(frozen=True)
class _Payload:
    """What a holder sends each rank that lacks the state: built once, however many receive it."""

    head: bytes  # JSON: layout, dtypes, values per dtype, digest, extras size
    buffers: dict[str, torch.Tensor]  # one flat buffer per dtype
    extras: bytes  # torch.save of the plain extras (read back with weights_only=True)


def _payload(cap: state.Captured, **more: int) -> _Payload:
    """``more``: other header fields (the step, for a state left in a file: train/left_state.py)."""
    buffers = _flat(cap.sharded)
    blob = io.BytesIO()
    torch.save({k: v for k, v in cap.extras.items() if k != "rng"}, blob)
    head = {
        "layout": _layout(cap.sharded),
        "dtypes": sorted(buffers),
        "numel": {d: b.numel() for d, b in buffers.items()},
        "digest": _digest(buffers),
        "extras": len(blob.getvalue()),
        **more,
    }
    return _Payload(json.dumps(head).encode(), buffers, blob.getvalue())


def _send(payload: _Payload, dst: int) -> int:
    """Send the payload to ``dst``; the bytes sent (tensors and extras)."""

    _send_bytes(payload.head, dst)
    sent = 0
    for d in sorted(payload.buffers):
        buf = payload.buffers[d]
        if buf.numel():
            dist.send(buf, dst)
            sent += buf.numel() * buf.element_size()
    _send_bytes(payload.extras, dst)
    return sent + len(payload.extras)


# Any: the user's training state (torch modules, optimizers, tensors, any object)
def _receive(targets: state.Targets, src: int, extras_limit: int) -> tuple[dict[str, Any], int]:

    head = json.loads(_recv_bytes(src, 1 << 24))
    mine = {k: _local(t) for k, t in targets.tensors.items()}
    buffers: dict[str, torch.Tensor] = {}
    got = 0
    for d, buf in empty_buffers(head, mine, f"rank {src}'s state", f"rank {src} sent"):
        if buf.numel():
            dist.recv(buf, src)
        buffers[d] = buf
        got += buf.numel() * buf.element_size()
    if _digest(buffers) != head["digest"]:
        raise LiveStateError(f"the state received from rank {src} fails its SHA-256 digest")
    blob = _recv_bytes(src, extras_limit)
    got += len(blob)
    extras = torch.load(io.BytesIO(blob), weights_only=True)
    unflatten(mine, buffers)
    return extras, got


# Any: a header parsed from JSON (checked here against this rank's own objects)
def empty_buffers(
    head: Any, mine: dict[str, torch.Tensor], whose: str, sender: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """For a state header: (dtype, an empty flat buffer to fill) in the header's order, after checking
    its layout against this rank's own local tensors ``mine``; LiveStateError when it does not fit."""
    if not isinstance(head, dict) or head.get("layout") != _layout(mine):
        raise LiveStateError(
            f"{whose} does not match this rank's model and optimizer "
            "(different keys, shapes or dtypes): the training function built different objects"
        )
    numel: dict[str, int] = {}
    dtypes: dict[str, torch.dtype] = {}
    for t in mine.values():  # the sizes only: no copy of this rank's own (fresh) state
        numel[str(t.dtype)] = numel.get(str(t.dtype), 0) + t.numel()
        dtypes[str(t.dtype)] = t.dtype
    counts = head.get("numel")
    for d in head.get("dtypes", ()):
        buf = torch.empty(numel.get(d, 0), dtype=dtypes.get(d, torch.uint8))
        said = counts.get(d) if isinstance(counts, dict) else None
        if buf.numel() != said:
            raise LiveStateError(f"{sender} {said} values of {d}, expected {buf.numel()}")
        yield d, buf


def unflatten(mine: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> None:
    """Copy the flat per-dtype buffers (keys in sorted order, as :func:`_flat` made them) into ``mine``."""
    offsets: dict[str, int] = {}
    for k in sorted(mine):
        t = mine[k]
        d = str(t.dtype)
        at = offsets.get(d, 0)
        with torch.no_grad():
            t.copy_(buffers[d][at : at + t.numel()].view_as(t))
        offsets[d] = at + t.numel()


def adopt(
    new: dict[str, Any],  # Any: the user's training state (torch modules, optimizers, tensors, any object)
    held: Held | None,
    *,
    restore_rng: Callable[[int], str],
    extras_limit: int = 1 << 30,
) -> Adopted | None:
    """Collective over the re-formed group: put the group's newest live state into ``new``. None when
    no rank holds live state (every rank then resumes from a checkpoint, as after a cold start).
    ``restore_rng(step)`` restores this rank's RNG streams as of the start of ``step`` ("" when it
    could, else why not)."""

    targets = state.load_targets(new)
    cap = state.capture(held.objects) if held is not None else None
    # a survivor whose shards were cut for another world holds nothing usable in this one
    step = (
        held.step
        if held is not None and cap is not None and same_shards(cap.sharded, targets.tensors)
        else -1
    )
    before = held.before if held is not None else None
    if before is not None and not same_shards(before[1].sharded, targets.tensors):
        before = None
    plan = plan_sources(_gather(step, before[0] if before else -1, _shard_key(targets.tensors)))
    if plan is None:
        state.forget_init(targets.fresh)
        return None
    # the lowest step every rank's shards are held at: a survivor that did not finish the interrupted
    # step still has the state before it (its update never ran), and every rank recorded its RNG at
    # that step's start, so redoing the interrupted step is exact; a survivor ahead by that step takes
    # the state too, or gives its copy from before the step when it kept one
    target, sources = plan
    me = dist.get_rank()
    received = 0
    if me not in sources:
        assert held is not None and cap is not None
        if target != step:
            assert before is not None and before[0] == target
            cap = before[1]  # its objects' state dicts are those of the step's start already
        elif held.boundary is not None:
            cap = state.Captured(cap.sharded, {**cap.extras, "objects": held.boundary})
        with torch.no_grad():
            for k, t in targets.tensors.items():
                _local(t).copy_(_local(cap.sharded[k]))
        state.apply(new, targets, cap.extras, own_rng=False)
        receivers = sorted(r for r, src in sources.items() if src == me)
        if receivers:
            payload = _payload(cap)  # flattened, digested and serialised once for every receiver
            for r in receivers:
                _send(payload, r)
    else:
        extras, received = _receive(targets, sources[me], extras_limit)
        state.apply(new, targets, extras, own_rng=False)
    note = restore_rng(target)
    return Adopted(target, sources.get(me, me), received, note)
