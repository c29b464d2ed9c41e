"""The engine's load path: list every committed version of every tier (newest step first, fastest
tier first for one step), and take the first that verifies on every rank, then load it in place.
Every version passed over is a CheckpointRejected event with its reason; nothing torn or tampered
with is ever loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ..errors import CheckpointError
from ..events import CheckpointLoaded, CheckpointRejected
from ..protocol.json_collective import JSON, PeerDataError
from .manifest import Manifest, read_manifest, verify_files
from .node_tier import Assembled, RestoreSource, assemble
from .outcomes import EngineLoad, EngineParts
from .persist import describe
from .safe_reader import SafeLoad, UnsafeCheckpoint, check_metadata, load_torch_file, refusal_line
from .store import FileStore, FsspecStore, step_name
from .tiers import TierConfig

Candidate = tuple[int, str, str]  # (step, tier name, location)


def candidates_to_json(cands: list[Candidate]) -> JSON:
    return [[step, tier, loc] for step, tier, loc in cands]


def candidates_from_json(value: JSON, rank: int) -> list[Candidate]:
    """The candidates rank ``rank`` sent; PeerDataError for anything but [[step, tier, location], ...]."""
    if not isinstance(value, list):
        raise PeerDataError(f"rank {rank} sent a {type(value).__name__} where a list of versions belongs")
    out: list[Candidate] = []
    for c in value:
        if not (isinstance(c, list) and len(c) == 3):
            raise PeerDataError(f"rank {rank} sent a malformed version entry")
        step, tier, loc = c
        if not (
            isinstance(step, int)
            and not isinstance(step, bool)
            and isinstance(tier, str)
            and isinstance(loc, str)
        ):
            raise PeerDataError(f"rank {rank} sent a malformed version entry")
        out.append((step, tier, loc))
    return out


@dataclass(frozen=True)
class _Verified:
    """One candidate as this rank checked it: where its files are here, and from where they came
    (the tier, or for a node-local tier "memory" or "peer"), or why it is refused."""

    path: Path
    manifest: Manifest | None
    source: str
    node_source: str
    reason: str


class TierWalk:
    def __init__(self, parts: EngineParts, fetch_dir: Path) -> None:
        self.parts = parts
        self.fetch_dir = fetch_dir  # object-tier versions are fetched here before they are verified

    def candidates(self, tiers: list[TierConfig]) -> list[Candidate]:
        """(step, tier, location), newest step first and, for one step, fastest tier first."""
        out = []
        for t in tiers:
            for step, loc in self.parts.stores[t.name].versions():
                out.append((step, t.speed, t.name, str(loc)))
        out.sort(key=lambda c: (-c[0], c[1]))
        return [(s, n, loc) for s, _, n, loc in out]

    def _all_candidates(self, tiers: list[TierConfig]) -> list[Candidate]:
        """Rank 0's candidates, plus the versions of node-local tiers any node has; with peers, the
        newest step of any tier is also looked for in the node-local tiers (a peer may hold it)."""
        p = self.parts
        node_local = {t.name for t in tiers if t.node_local}
        every = p.comm.all_gather(candidates_to_json(self.candidates(tiers)))
        gathered = [candidates_from_json(v, r) for r, v in enumerate(every)]
        seen = {(s, n) for c in gathered for s, n, _ in c if n in node_local}
        if gathered[0] and p.link.successor() is not None:
            seen |= {(gathered[0][0][0], n) for n in node_local}
        out = {(s, n): loc for s, n, loc in gathered[0]}
        for s, n in seen:
            out.setdefault((s, n), str(self._file_store(n).final(s)))
        order = {t.name: t.speed for t in tiers}
        return [(s, n, loc) for (s, n), loc in sorted(out.items(), key=lambda c: (-c[0][0], order[c[0][1]]))]

    def _file_store(self, tier: str) -> FileStore:
        store = self.parts.stores[tier]
        assert isinstance(store, FileStore), f"tier {tier} is node-local, so a file tier"
        return store

    def _local_path(self, step: int, tier: str, loc: str) -> Path:
        p = self.parts
        store = p.stores[tier]
        if isinstance(store, FsspecStore):
            dest = self.fetch_dir / tier / step_name(step)
            if p.rank == 0:
                store.fetch(step, dest)
            p.comm.barrier()
            return dest
        return Path(loc)

    def _node_path(self, step: int, tier: str) -> tuple[Path, str, str, str]:
        """A node-local version made complete on this node by its leader:
        (path, the job's source, this node's source, reason); a source is "memory" or "peer"."""
        p = self.parts
        res = None
        if p.link.leader:
            res = assemble(p.link, self._file_store(tier), step, clock=p.clock)
        every = p.comm.all_gather(res.to_json() if res is not None else None)
        gathered = [Assembled.from_json(v, r) if v is not None else None for r, v in enumerate(every)]
        mine = gathered[p.rank + p.link.leader_rank_offset]
        if mine is None:
            return Path(), "", "", f"no result from this node's leader (local rank 0) for rank {p.rank}"
        sources = {g.source for g in gathered if g is not None and not g.reason}
        job = RestoreSource.PEER if RestoreSource.PEER in sources else RestoreSource.MEMORY
        return Path(mine.path), job.value, mine.source.value if mine.source else "", mine.reason

    def _verify(self, step: int, tier: str, loc: str, node_local: bool) -> _Verified:
        """This rank's share of checking one candidate (its stride of the files)."""
        p = self.parts
        key = p.stores[tier].key
        if node_local:
            path, source, node_source, reason = self._node_path(step, tier)
            manifest = None
            if not reason:
                manifest, reason = read_manifest(path, key)
            if manifest is not None:  # the leader verified every file; each rank checks its stride
                names = sorted(manifest.files)[p.link.local_rank :: p.link.local_world]
                reason = check_metadata(path, names)
            return _Verified(path, manifest, source, node_source, reason)
        path = self._local_path(step, tier, loc)
        manifest, reason = read_manifest(path, key)
        if manifest is not None:
            names = sorted(manifest.files)[p.rank :: p.world_size]
            reason = verify_files(path, manifest, names) or check_metadata(path, names)
        return _Verified(path, manifest, tier, tier, reason)

    def _reject(self, rejected: list[str], step: int, tier: str, loc: str, why: str) -> None:
        rejected.append(f"{tier} {step_name(step)}: {why}")
        if self.parts.rank == 0:
            self.parts.sink(
                CheckpointRejected(ts=self.parts.wall(), path=str(loc), reason=f"{tier}: {why}", step=step)
            )

    # Any: torch state_dict values (tensors, nested containers, user objects)
    def load_latest(
        self, tiers: list[TierConfig], target_state: dict[str, Any], max_step: int | None = None
    ) -> EngineLoad | None:
        """Collective: load, in place into ``target_state``, the newest version that verifies
        (resharding to this world size), of a step no later than ``max_step`` when one is given."""
        p = self.parts
        t0 = p.clock()
        cands = candidates_from_json(p.comm.broadcast(candidates_to_json(self._all_candidates(tiers))), 0)
        if max_step is not None:  # a rollback: newer versions are not trusted
            cands = [c for c in cands if c[0] <= max_step]
        rejected: list[str] = []
        node_local = {t.name for t in tiers if t.node_local}
        for step, tier, loc in cands:
            got = self._verify(step, tier, loc, tier in node_local)
            if reasons := p.gather_reasons(got.reason):
                self._reject(rejected, step, tier, loc, reasons[0])
                continue
            assert got.manifest is not None
            rank_state, src, reason = self._read_rank_state(got.path, got.manifest)
            if reasons := p.gather_reasons(reason):
                # refused extras (e.g. a pickled object): fall back like any other bad version
                self._reject(rejected, step, tier, loc, reasons[0])
                continue
            if why := self._load_tensors(got.path, target_state):
                self._reject(rejected, step, tier, loc, why)
                continue
            dt = p.clock() - t0
            if p.rank == 0 or (
                p.link.leader and got.node_source == RestoreSource.PEER.value
            ):  # a node that fetched says so
                p.sink(
                    CheckpointLoaded(
                        ts=p.wall(),
                        step=step,
                        path=str(loc),
                        duration_s=dt,
                        tier=got.source if p.rank == 0 else got.node_source,
                    )
                )
            return EngineLoad(
                step,
                str(loc),
                got.source,
                rank_state,
                dt,
                got.manifest.world_size,
                tuple(rejected),
                str(got.path),
                src,
            )
        return None

    # Any: torch state_dict values (tensors, nested containers, user objects)
    def _load_tensors(self, path: Path, target_state: dict[str, Any]) -> str:
        """Collective ``dcp.load`` into ``target_state``; returns why the version was refused ("" when
        loaded). Every rank gets DCP's same exception, so all fall back together."""
        safe = SafeLoad(path)
        try:
            if target_state:
                dcp.load(target_state, process_group=self.parts.comm.group, **safe.kwargs)
        except (Exception, CheckpointException) as exc:
            if why := safe.refused(exc):
                return why
            raise CheckpointError(
                f"checkpoint {path} verified but does not fit the state to load: {describe(exc)}",
                "load with the same state layout (model/optimizer keys) it was saved with",
            ) from exc
        return ""

    # Any: a per-rank object of the user's, anything torch.save pickles
    def _read_rank_state(self, path: Path, manifest: Manifest) -> tuple[Any, int, str]:
        """This rank's extras, or (world size changed, this rank is new) those of rank
        ``rank % saved world size``. Tensors and plain data only: ``weights_only=True`` refuses
        any pickled object, which rejects the whole version. Returns (state, source rank, reason)."""
        source = self.parts.rank % max(1, manifest.world_size)
        name = f"rank-{source}.pt"
        if name not in manifest.files:
            return None, -1, ""
        try:
            return load_torch_file(path / name), source, ""
        except UnsafeCheckpoint as exc:
            return None, source, f"{name} holds more than tensors and plain data: {exc.message}"
        except Exception as exc:  # damaged past what the digest caught: reject, never crash the load
            return None, source, f"{name} cannot be read: {refusal_line(exc)}"
