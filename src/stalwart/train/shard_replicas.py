"""Which ranks are replicas of one another, for the silent-data-corruption check (``replica_check.py``).

Data parallelism (DDP): every rank holds the whole state, so every rank is a replica of every other.
Sharded state (DTensors): only ranks at the same shard position hold the same local shards. Under
HSDP (torch's ``fully_shard`` over a 2-D mesh, placements ``(Replicate(), Shard(0))``) those are the
ranks along the mesh dim every DTensor is replicated on; plain FSDP or tensor parallelism has no
such dim (every rank a different shard), and there is nothing to compare.

The replica groups are read from the mesh's layout (``DeviceMesh.mesh``, the global rank at each
coordinate): the group along ``dim`` of each rank is its row once that dim is moved last, the same
ranks ``mesh.get_group(dim)`` holds for it. The check gathers every rank's fingerprints (one small
vector each) and compares them group by group, so that every rank sees every group's finding and all
take the same action (a rollback is taken by every rank, whichever group disagreed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.placement_types import Placement

from ..policy.sdc import SEVERAL_CONFIDENCE, Localisation, ReplicaVerdict, localise

NO_REPLICAS = "no replicas of a shard to compare"


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard, any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def replicate_dim(placements: Sequence[Sequence[Placement]]) -> int | None:
    """The first mesh dim every DTensor is replicated on (``Replicate()``), or None."""
    if not placements:
        return None
    width = min(len(p) for p in placements)
    for dim in range(width):
        if all(isinstance(p[dim], Replicate) for p in placements):
            return dim
    return None


def groups_along(layout: torch.Tensor, dim: int) -> list[list[int]]:
    """The replica groups along ``dim`` of a mesh whose global ranks are ``layout``: each group holds
    the ranks that differ only in their coordinate on ``dim``."""
    return [[int(r) for r in row] for row in layout.movedim(dim, -1).reshape(-1, layout.shape[dim]).tolist()]


@dataclass(frozen=True)
class Replicas:
    """The replica groups (global ranks, each group in mesh order), or why there are none."""

    groups: tuple[tuple[int, ...], ...]
    off: str = ""  # why the check cannot apply ("" when it can)
    sharded: bool = False  # the state is DTensors: groups are a shard's replicas


def replicas_of(tensors: Sequence[torch.Tensor], world: int) -> Replicas:
    """The ranks that must hold identical local state, from the tensors' placements."""
    everyone = (tuple(range(world)),)
    dts = [t for t in tensors if isinstance(t, DTensor)]
    if not dts:
        return Replicas(everyone)
    mesh = dts[0].device_mesh
    if any(t.device_mesh != mesh for t in dts):
        return Replicas((), f"sharded state on several device meshes: {NO_REPLICAS}", True)
    dim = replicate_dim([t.placements for t in dts])
    if dim is None or mesh.size(dim) < 2:
        return Replicas((), f"every rank holds a different shard (FSDP/TP): {NO_REPLICAS}", True)
    groups = tuple(tuple(g) for g in groups_along(mesh.mesh, dim))
    if sorted(r for g in groups for r in g) != list(range(world)):
        return Replicas((), f"the device mesh does not span every rank: {NO_REPLICAS}", True)
    return Replicas(groups, sharded=True)


def localise_groups(
    rows: Sequence[Sequence[int]], groups: Sequence[Sequence[int]]
) -> tuple[Localisation, tuple[int, ...]]:
    """Compare every rank's fingerprints (``rows``, by global rank) within each replica group. Returns
    one finding naming global ranks, and the group a replay should judge (the first that disagreed)."""
    if len(groups) == 1 and list(groups[0]) == list(range(len(rows))):
        return localise(rows), tuple(groups[0])
    found = [(g, localise([rows[r] for r in g])) for g in groups]
    bad = [(tuple(g), f) for g, f in found if not f.clean]
    if not bad:
        return Localisation(
            ReplicaVerdict.AGREE, (), 0.0, (), f"every shard's {len(groups[0])} replicas agree"
        ), ()
    tensors = tuple(sorted({t for _, f in bad for t in f.tensors}))
    reason = "; ".join(f"replicas of ranks {', '.join(map(str, g))} (by place): {f.reason}" for g, f in bad)
    suspects = tuple(sorted(g[i] for g, f in bad for i in f.suspects))
    worst = next(((g, f) for g, f in bad if f.verdict is not ReplicaVerdict.ODD_ONE_OUT), None)
    if worst is not None:  # a group named nobody: a shared cause is as likely as the named ones
        return Localisation(worst[1].verdict, (), worst[1].confidence, tensors, reason), worst[0]
    confidence = bad[0][1].confidence if len(suspects) == 1 else SEVERAL_CONFIDENCE
    return Localisation(ReplicaVerdict.ODD_ONE_OUT, suspects, confidence, tensors, reason), bad[0][0]
