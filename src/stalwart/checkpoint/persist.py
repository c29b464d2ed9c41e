"""Persist phase: write one staged snapshot to one tier, verify-ready, and commit it atomically.

Runs on the engine's background thread. Every rank writes its own shards through
torch.distributed.checkpoint and takes the SHA-256 of what it wrote; rank 0 gathers the file list, writes the
manifest last and commits. If any rank fails (a full disk, an I/O error), nothing is committed,
the partial directory is removed and every older version stays as it was.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from pydantic import ValidationError
from torch.distributed.checkpoint.api import CheckpointException

from ..errors import CheckpointError
from ..protocol.json_collective import JSON, PeerDataError
from .collective import Collective
from .manifest import MANIFEST, FileEntry, Manifest, parse_checked, read_manifest, sha256_file, verify_files
from .safe_reader import METADATA, check_metadata_file, unsafe_values
from .staging import Snapshot
from .store import FileStore, FsspecStore
from .tiers import TierConfig

# Any: torch.distributed.checkpoint's StorageWriter, imported lazily (heavy)
WriterFactory = Callable[[Path, TierConfig], Any]


class PersistError(Exception):
    """A tier could not be written; the reason names the rank and the cause."""


def _written_from_json(value: JSON, rank: int) -> tuple[str, dict[str, FileEntry]]:
    """What rank ``rank`` wrote, as it sent it: [error, {file name: entry}]; PeerDataError for anything else."""
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], dict)
    ):
        try:
            return value[0], {n: FileEntry.model_validate(e, strict=True) for n, e in value[1].items()}
        except ValidationError:
            pass
    raise PeerDataError(f"rank {rank} sent a malformed list of written files")


def _manifest_from_json(value: JSON) -> Manifest | str:
    """Rank 0's manifest (its JSON text) or its error ([text]); PeerDataError for anything else."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if isinstance(value, str):
        try:
            return Manifest.from_json(value)
        except ValueError as exc:
            raise PeerDataError(f"rank 0 sent a manifest that does not parse: {exc}") from None
    raise PeerDataError(f"rank 0 sent a {type(value).__name__} where a manifest belongs")


def describe(exc: BaseException) -> str:
    """One line per cause; DCP wraps each rank's exception in a CheckpointException."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"dcp rank {r}: {describe(e)}" for r, (e, _) in sorted(exc.failures.items()))
    return f"{type(exc).__name__}: {exc}"


# Any: torch.distributed.checkpoint's StorageWriter, imported lazily (heavy)
def default_writer(path: Path, tier: TierConfig) -> Any:
    return dcp.FileSystemWriter(path, single_file_per_rank=True, sync_files=tier.do_fsync, overwrite=True)


def _fsynced_save(obj: Any, path: Path, fsync: bool) -> None:  # Any: torch.save takes any picklable object
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())


class Persister:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        comm: Collective,
        writer_factory: WriterFactory = default_writer,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.comm = comm
        self.writer_factory = writer_factory
        self.clock = clock

    def _gather_errors(self, err: str) -> str:
        errs = [f"rank {r}: {e}" for r, e in enumerate(self.comm.all_gather_str(err)) if e]
        return errs[0] if errs else ""

    def to_files(
        self,
        snap: Snapshot,
        tier: TierConfig,
        store: FileStore,
        *,
        emergency: bool,
        leader: bool | None = None,
    ) -> Path:
        """Collective: write ``snap`` into ``store`` and commit it; raise PersistError on failure.
        ``leader``: for a node-local tier (each node has its own directory at the same path), whether
        this rank creates and commits its node's directory; every node's copy gets the full manifest
        but holds only its own ranks' files (and rank 0's metadata). Default: one directory, rank 0."""
        node_local = leader is not None
        leader = self.rank == 0 if leader is None else leader
        self._begin(snap, store, leader)
        err, entries = self._write_shards(snap, tier, store.partial(snap.step))
        every = self.comm.all_gather(
            [err, {n: e.model_dump(mode="json", exclude_none=True) for n, e in entries.items()}]
        )
        gathered = [_written_from_json(v, r) for r, v in enumerate(every)]
        errs = [f"rank {r}: {e}" for r, (e, _) in enumerate(gathered) if e]
        if errs:
            if leader:
                store.discard(snap.step)
            self.comm.barrier()
            raise PersistError(errs[0])
        if node_local:
            return self._commit_nodes(snap, store, gathered, leader, emergency)
        return self._commit_one(snap, store, gathered, emergency)

    def _begin(self, snap: Snapshot, store: FileStore, leader: bool) -> None:
        """Collective: the leader creates the partial directory; refuse a state that only a full
        unpickle could read back (it would be refused on load: fail the save instead)."""
        err = ""
        if leader:
            try:
                store.begin(snap.step)
            except OSError as exc:
                err = f"cannot create {store.partial(snap.step)}: {exc}"
            except CheckpointError as exc:  # an unsafe tier root: every rank must hear of it
                err = str(exc)
        if err := self._gather_errors(err):
            raise PersistError(err)
        if err := self._gather_errors(unsafe_values(snap.state)):
            if leader:
                store.discard(snap.step)
            raise PersistError(f"{err}; keep tensors, numbers, strings, lists and dicts in the state")

    def _write_shards(self, snap: Snapshot, tier: TierConfig, work: Path) -> tuple[str, dict[str, FileEntry]]:
        """Collective (DCP): write this rank's shards and extras into ``work``; returns (error, the
        files this rank wrote with their sizes and digests)."""
        entries: dict[str, FileEntry] = {}
        try:
            dcp.save(
                snap.state, storage_writer=self.writer_factory(work, tier), process_group=self.comm.group
            )
            if self.rank == 0 and (why := check_metadata_file(work / METADATA)):
                raise PersistError(f"the DCP metadata just written would be refused on load: {why}")
            mine = [f"rank-{self.rank}.pt"] if snap.rank_state is not None else []
            if mine:
                _fsynced_save(snap.rank_state, work / mine[0], tier.do_fsync)
            prefix = f"__{self.rank}_"
            mine += [n for n in os.listdir(work) if n.startswith(prefix)]
            if self.rank == 0:
                mine.append(".metadata")
            for name in mine:
                f = work / name
                entries[name] = FileEntry(size=f.stat().st_size, sha256=sha256_file(f))
        except (Exception, CheckpointException) as exc:  # every failure must reach the other ranks
            return describe(exc), entries
        return "", entries

    def _commit_one(
        self,
        snap: Snapshot,
        store: FileStore,
        gathered: list[tuple[str, dict[str, FileEntry]]],
        emergency: bool,
    ) -> Path:
        """Rank 0 writes the manifest and commits the one directory; every rank hears the outcome."""
        outcome = ""
        if self.rank == 0:
            try:  # a step the manifest cannot hold (e.g. not a plain int) fails here, on rank 0 only
                store.commit(snap.step, self._manifest(snap, gathered, emergency))
            except (OSError, ValueError) as exc:
                store.discard(snap.step)
                outcome = "rank 0: commit failed: " + " ".join(str(exc).split())[:300]
        outcome = self.comm.broadcast_str(outcome)
        if outcome:
            raise PersistError(outcome)
        return store.final(snap.step)

    def _manifest(
        self, snap: Snapshot, gathered: list[tuple[str, dict[str, FileEntry]]], emergency: bool
    ) -> Manifest:
        files: dict[str, FileEntry] = {}
        for _, ent in gathered:
            files.update(ent)
        return Manifest(
            step=snap.step,
            world_size=self.world_size,
            files=files,
            created=self.clock(),
            meta={"emergency": emergency, "bytes": snap.bytes},
        )

    def _commit_nodes(
        self,
        snap: Snapshot,
        store: FileStore,
        gathered: list[tuple[str, dict[str, FileEntry]]],
        leader: bool,
        emergency: bool,
    ) -> Path:
        """Rank 0 writes the manifest; every node's leader commits it in its own directory."""
        made: Manifest | str = ""
        if self.rank == 0:
            try:
                made = self._manifest(snap, gathered, emergency)
            except ValueError as exc:
                made = "rank 0: manifest: " + " ".join(str(exc).split())[:300]
        made = _manifest_from_json(
            self.comm.broadcast(made.to_json() if isinstance(made, Manifest) else [made])
        )
        err = made if isinstance(made, str) else ""
        if leader and isinstance(made, Manifest):
            try:
                store.commit(snap.step, made)
            except OSError as exc:
                err = f"commit failed: {exc}"
        if err := self._gather_errors(err):
            if leader:
                store.discard(snap.step)
                store.delete(snap.step)  # no node keeps a version another node could not commit
            raise PersistError(err)
        return store.final(snap.step)

    def to_object(self, step: int, source: Path, store: FsspecStore) -> str:
        """Rank 0 uploads a committed local version (data first, manifest last)."""
        manifest, reason = read_manifest(source, store.key)
        if manifest is None:
            raise PersistError(f"source {source} is not committed: {reason}")
        return store.upload(step, source, manifest)


def copy_version(src: Path, store: FileStore, *, emergency: bool) -> Path:
    """Copy a committed version (verified first) into another file store and commit it there."""
    manifest, reason = read_manifest(src, store.key)
    if manifest is None or (reason := verify_files(src, manifest)):
        raise PersistError(f"source {src} does not verify: {reason}")
    work = store.begin(manifest.step)
    for name in sorted(manifest.files):
        with open(src / name, "rb") as fin, open(work / name, "wb") as fout:
            shutil.copyfileobj(fin, fout, 16 << 20)
            fout.flush()
            if store.fsync:
                os.fsync(fout.fileno())
    meta = dict(manifest.meta, emergency=emergency, copied_from=str(src))
    return store.commit(manifest.step, manifest.model_copy(update={"meta": meta}))


def retain_files(store: FileStore, keep: int) -> list[Path]:
    """Delete versions older than the ``keep`` newest that pass a quick check (manifest + sizes).

    A version is deleted only when ``keep`` newer good ones exist, so the newest good version is
    never deleted, whatever state the newer ones are in. With a key, a version counts as good only
    with a valid MAC, so planted versions cannot push the real ones out."""

    def good(path: Path) -> bool:
        manifest, _ = read_manifest(path, store.key)
        return manifest is not None and not verify_files(path, manifest, checksums=False)

    return _retain(store, keep, good)


def retain_object(store: FsspecStore, keep: int) -> list[str]:
    """The same rule on an object store, where a committed version is one whose manifest exists and
    parses (and, with a key, carries a valid MAC)."""

    def good(loc: str) -> bool:
        try:
            data = store.fs.cat_file(f"{loc}/{MANIFEST}")
        except FileNotFoundError:
            return False
        return parse_checked(data, store.key)[0] is not None

    return _retain(store, keep, good)


def _retain(store, keep: int, is_good) -> list:
    """Walk versions newest-first; once ``keep`` good ones are seen, delete everything older."""
    good = 0
    deleted = []
    for step, where in store.versions():
        if good >= keep:
            store.delete(step)
            deleted.append(where)
        elif is_good(where):
            good += 1
    return deleted


def retain_node_files(store: FileStore, keep: int) -> list[Path]:
    """Retention for a node-local tier, whose versions hold only this node's files: a version
    counts as good when its manifest reads (and, with a key, carries a valid MAC)."""
    return _retain(store, keep, lambda path: read_manifest(path, store.key)[0] is not None)
