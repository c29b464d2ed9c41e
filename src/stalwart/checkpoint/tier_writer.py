"""The engine's save path, on its background thread: persist one staged snapshot to each chosen
tier (file, node-local or object), apply each tier's retention, replicate node-local versions to
the successor node, and report every commit and failure as an event (rank 0, or a node's leader
for its replica)."""

from __future__ import annotations

from pathlib import Path

from ..events import CheckpointCommitted
from ..events.checkpoint import CheckpointPersistFailed, PeerReplicated
from .manifest import read_manifest
from .node_tier import send_files, send_manifest
from .outcomes import EngineParts, PersistResult, TierCommit
from .persist import Persister, PersistError, retain_files, retain_node_files, retain_object
from .staging import Snapshot
from .store import FileStore, FsspecStore
from .tiers import TierConfig


class TierWriter:
    def __init__(self, parts: EngineParts, persister: Persister, scratch: FileStore) -> None:
        self.parts = parts
        self.persister = persister
        self.scratch = scratch  # where an object tier's version is written first when no file tier is
        self.last_persist_s: dict[str, float] = {}

    def persist(self, snap: Snapshot, tiers: list[TierConfig], emergency: bool) -> PersistResult:
        """Collective: write ``snap`` to every tier in ``tiers``, fastest first. A tier that fails is
        reported and skipped; the others are still written."""
        p = self.parts
        commits: list[TierCommit] = []
        source: Path | None = None
        stall_reported = False
        for t in tiers:
            t0 = p.clock()
            copy: tuple[Path, bytes | None] | None = None
            try:
                path, source, copy = self._write(snap, t, emergency, source)
                ok, reason = True, ""
            except (PersistError, OSError) as exc:
                ok, path, reason = False, "", str(exc)
            except Exception:
                # a peer lost in a collective that came after the commit (the outcome's broadcast, the
                # nodes' agreement): the version stands on disk and a restart may load it, so the
                # ledger records it before the failure goes on to the re-formation
                self._record_if_committed(snap, t, p.clock() - t0, stall_reported, emergency)
                raise
            dt = p.clock() - t0
            commits.append(TierCommit(t.name, ok, path, dt, reason))
            if not ok:
                if p.rank == 0:
                    p.sink(CheckpointPersistFailed(ts=p.wall(), step=snap.step, tier=t.name, reason=reason))
                continue
            self.last_persist_s[t.name] = dt
            if t.durable:
                p.durable.raise_to(snap.step)
            if p.rank == 0:
                p.sink(self._committed(snap, t, path, dt, stall_reported, emergency))
            stall_reported = True
            # the version is committed and recorded before its copy to the successor node starts: the
            # copy is collective, and a peer lost during it must not take the commit's record with it
            if copy is not None:
                self._replicate(*copy)
                self.last_persist_s[t.name] = p.clock() - t0  # the background's time, copy included
        return PersistResult(snap.step, tuple(commits), emergency)

    def _committed(
        self, snap: Snapshot, t: TierConfig, path: str, dt: float, stall_reported: bool, emergency: bool
    ) -> CheckpointCommitted:
        """The commit event of ``snap`` on tier ``t``; the save's stall goes on its first one only."""
        return CheckpointCommitted(
            ts=self.parts.wall(),
            step=snap.step,
            path=path,
            stall_s=0.0 if stall_reported else snap.stall_s,
            persist_s=dt,
            bytes=snap.bytes,
            tier=t.name,
            emergency=emergency,
        )

    def _record_if_committed(
        self, snap: Snapshot, t: TierConfig, dt: float, stall_reported: bool, emergency: bool
    ) -> None:
        """Rank 0: the commit event of ``snap`` on tier ``t`` when its version is committed there."""
        p = self.parts
        store = p.stores[t.name]
        if p.rank != 0 or not isinstance(store, FileStore):
            return
        final = store.final(snap.step)
        manifest, _ = read_manifest(final, store.key)
        if manifest is not None and manifest.step == snap.step:
            p.sink(self._committed(snap, t, str(final), dt, stall_reported, emergency))

    def _write(
        self, snap: Snapshot, t: TierConfig, emergency: bool, source: Path | None
    ) -> tuple[str, Path | None, tuple[Path, bytes | None] | None]:
        """Persist to one tier; returns where it went, the committed file version an object tier may
        upload from (the first shared file tier written), and for a node-local tier the version to
        copy to the successor node with its key."""
        p = self.parts
        store = p.stores[t.name]
        if isinstance(store, FileStore) and t.node_local:
            path = self.persister.to_files(snap, t, store, emergency=emergency, leader=p.link.leader)
            if p.link.leader:
                retain_node_files(store, t.keep)
            return str(path), source, (path, store.key)
        if isinstance(store, FileStore):
            path = self.persister.to_files(snap, t, store, emergency=emergency)
            if p.rank == 0:
                retain_files(store, t.keep)
            return str(path), source or path, None
        return self._persist_object(snap, t, store, source), source, None

    def _replicate(self, version: Path, key: bytes | None) -> None:
        """Collective: send this node's files of a node-local version to the successor node. A
        failure is reported (the version stays committed on this node, without a second copy)."""
        p = self.parts
        peer = p.link.successor()
        if p.comm.all_gather_bool(peer is not None) != [True] * p.world_size:
            return
        t0 = p.clock()
        manifest, why = read_manifest(version, key)
        files = size = 0
        if manifest is None:
            reason = f"cannot read the committed manifest: {why}"
        else:
            files, size, reason = send_files(p.link, version, manifest, p.rank)
        reasons = p.gather_reasons(reason)
        if not reasons and p.link.leader:
            reason = send_manifest(p.link, version)
        reasons += p.gather_reasons(reason if not reasons else "")
        if p.link.leader:  # one event per node: its copy on its successor
            p.sink(
                PeerReplicated(
                    ts=p.wall(),
                    step=manifest.step if manifest else -1,
                    peer=peer.node if peer else "",
                    files=files,
                    bytes=size,
                    duration_s=p.clock() - t0,
                    ok=not reasons,
                    reason=reasons[0] if reasons else "",
                )
            )

    def _persist_object(self, snap: Snapshot, t: TierConfig, store: FsspecStore, source: Path | None) -> str:
        p = self.parts
        scratch = source is None
        if source is None:
            source = self.persister.to_files(snap, t, self.scratch, emergency=False)
        try:
            dest = ""
            if p.rank == 0:
                dest = self.persister.to_object(snap.step, source, store)
                retain_object(store, t.keep)
        finally:
            if scratch and p.rank == 0:
                self.scratch.delete(snap.step)
        return dest
