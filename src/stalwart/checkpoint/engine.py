"""The checkpoint engine: stage (the only stall), persist in the background to tiers, verified load.

Typical use in a training loop::

    engine = CheckpointEngine(default_tiers(local_dir="ckpt", job="run1"), rank=r, world_size=w)
    found = engine.load_latest(state)           # in place, reshards if the world size changed
    for step in ...:
        ...
        engine.save(step, state, rank_state)    # returns after the host copy; persist runs behind
    engine.close()

All ranks call ``save``, ``load_latest``, ``emergency_persist`` and the constructor together.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ..errors import CheckpointError
from ..events import CheckpointCommitted, CheckpointLoaded, CheckpointRejected, CheckpointStaged, Event
from .background import Background
from .collective import Collective
from .events import CheckpointPersistFailed, EmergencyCheckpoint, PeerReplicated
from .manifest import read_manifest, verify_files
from .node_tier import NodeLink, assemble, send_files, send_manifest
from .persist import (
    Persister,
    PersistError,
    WriterFactory,
    copy_version,
    default_writer,
    describe,
    retain_files,
    retain_node_files,
    retain_object,
)
from .safe_reader import SafeLoad, UnsafeCheckpoint, check_metadata, load_torch_file, refusal_line
from .staging import Snapshot, Stager
from .store import FileStore, FsspecStore, step_name
from .tiers import SPEED_ORDER, TierConfig, validate_tiers

Sink = Callable[[Event], None]


@dataclass(frozen=True)
class TierCommit:
    tier: str
    ok: bool
    path: str
    persist_s: float
    reason: str = ""


@dataclass(frozen=True)
class PersistResult:
    step: int
    commits: tuple[TierCommit, ...]
    emergency: bool = False

    @property
    def committed(self) -> tuple[str, ...]:
        return tuple(c.tier for c in self.commits if c.ok)


@dataclass(frozen=True)
class SaveTicket:
    """What ``save`` did: the stall it caused and the background persist (if any)."""

    step: int
    stall_s: float
    bytes: int
    tiers: tuple[str, ...]
    future: Future[PersistResult] | None
    skipped: str = ""


@dataclass(frozen=True)
class EngineLoad:
    step: int
    path: str
    tier: str
    rank_state: Any
    duration_s: float
    world_size: int
    rejected: tuple[str, ...] = ()
    local_path: str = ""  # where the verified files are on this machine (fetched for object tiers)
    rank_state_from: int = -1  # the saved rank whose extras these are (differs after a world-size change)


@dataclass(frozen=True)
class EmergencyResult:
    step: int
    committed: bool
    tier: str
    duration_s: float
    reason: str


def _lower_thread_priority(nice: int) -> None:
    """Run the persist thread at a lower CPU priority than the training loop (Linux: per thread)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError:
        pass


class CheckpointEngine:
    def __init__(
        self,
        tiers: Sequence[TierConfig],
        *,
        rank: int = 0,
        world_size: int = 1,
        process_group: Any = None,
        sink: Sink | None = None,
        stager: Stager | None = None,
        writer_factory: WriterFactory = default_writer,
        on_busy: Literal["skip", "wait"] = "skip",
        fetch_dir: str | None = None,
        persist_nice: int = 10,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
        link: NodeLink | None = None,
    ) -> None:
        self.tiers = validate_tiers(list(tiers))
        self.rank = rank
        # default: every rank on one node (node-local tiers then behave like any file tier)
        self.link = link or NodeLink(local_rank=rank, local_world=world_size)
        self.world_size = world_size
        self.on_busy = on_busy
        self._sink = sink or (lambda ev: None)
        self._clock = clock
        self._wall = wall
        self.comm = Collective.create(world_size, process_group)
        self.stager = stager or Stager(clock=clock)
        self._persister = Persister(
            rank=rank, world_size=world_size, comm=self.comm, writer_factory=writer_factory, clock=wall
        )
        self._stores: dict[str, FileStore | FsspecStore] = {
            t.name: FileStore(t.location, fsync=t.do_fsync) if t.is_file else FsspecStore(t.location)
            for t in self.tiers
        }
        first_file = next((t for t in self.tiers if t.is_file), None)
        base = (
            Path(fetch_dir) if fetch_dir else (Path(first_file.location) if first_file else Path(".stalwart"))
        )
        self._fetch_dir = base / ".fetch"
        self._scratch = FileStore(base / ".object-staging", fsync=False)
        self._last: dict[str, int | None] = {t.name: None for t in self.tiers}
        self._executor = Background("stalwart-ckpt", _lower_thread_priority, (persist_nice,))
        self._inflight: tuple[Future[PersistResult], int, tuple[str, ...]] | None = None
        self._latest: Snapshot | None = None
        self._lock = threading.Lock()
        self._durable_step: int | None = None
        self.last_persist_s: dict[str, float] = {}
        self.last_stall_s: float | None = None
        for t in self.tiers:
            s = self._stores[t.name]
            if isinstance(s, FileStore) and (self.link.leader if t.node_local else rank == 0):
                s.sweep_partials()
        if rank == 0:
            self._scratch.sweep_partials()
        self.comm.barrier()

    # --- save --------------------------------------------------------------------------------

    def tier(self, name: str) -> TierConfig:
        return next(t for t in self.tiers if t.name == name)

    def set_interval(self, name: str, every_steps: int) -> None:
        """Change one tier's interval (the advisor's auto mode uses this)."""
        self.tiers = [
            t.model_copy(update={"every_steps": max(1, int(every_steps))}) if t.name == name else t
            for t in self.tiers
        ]

    def due_tiers(self, step: int) -> list[TierConfig]:
        return [
            t
            for t in self.tiers
            if self._last[t.name] is None or step - (self._last[t.name] or 0) >= t.every_steps
        ]

    def busy(self) -> bool:
        return self._inflight is not None and not self._inflight[0].done()

    def stage(
        self, step: int, state: dict[str, Any], rank_state: Any = None, *, _t0: float | None = None
    ) -> Snapshot:
        """Copy the state into the host buffers (blocking: this is the stall) and keep it as latest."""
        if self.busy():
            raise CheckpointError(
                "cannot stage while a persist still reads the staging buffers",
                "call wait() first or use save(), which skips or waits",
            )
        self._latest = None  # the buffers are being overwritten: no consistent snapshot until done
        snap = self.stager.stage(step, state, rank_state)
        if _t0 is not None:  # save(): the stall also covers the busy check before staging
            snap = replace(snap, stall_s=self._clock() - _t0)
        self._latest = snap
        self.last_stall_s = snap.stall_s
        if self.rank == 0:
            self._sink(CheckpointStaged(ts=self._wall(), step=step, stall_s=snap.stall_s, bytes=snap.bytes))
        return snap

    def save_async(
        self, snap: Snapshot, tiers: Sequence[str] | None = None, *, emergency: bool = False
    ) -> Future[PersistResult]:
        names = tuple(tiers) if tiers is not None else tuple(t.name for t in self.tiers)
        chosen = [self.tier(n) for n in names]
        fut = self._executor.submit(self._persist, snap, chosen, emergency)
        self._inflight = (fut, snap.step, names)
        return fut

    def save(
        self,
        step: int,
        state: dict[str, Any],
        rank_state: Any = None,
        *,
        force: bool = False,
        emergency: bool = False,
    ) -> SaveTicket:
        """Stage now and persist in the background to every tier that is due (all if ``force``)."""
        due = list(self.tiers) if force else self.due_tiers(step)
        if emergency:  # a node memory tier goes with the job: an emergency save is for what outlives it
            due = [t for t in due if not t.node_local] or due
        if not due:
            return SaveTicket(step, 0.0, 0, (), None, skipped="no tier due")
        t0 = self._clock()
        if self.comm.any_default_group(self.busy()):
            if self.on_busy == "skip":
                return SaveTicket(
                    step,
                    self._clock() - t0,
                    0,
                    (),
                    None,
                    skipped="previous persist still running; interval shorter than persist time",
                )
            self.wait()
        snap = self.stage(step, state, rank_state, _t0=t0)
        for t in due:
            self._last[t.name] = step
        fut = self.save_async(snap, [t.name for t in due], emergency=emergency)
        return SaveTicket(step, snap.stall_s, snap.bytes, tuple(t.name for t in due), fut)

    def wait(self, timeout: float | None = None) -> PersistResult | None:
        if self._inflight is None:
            return None
        return self._inflight[0].result(timeout)

    def _persist(self, snap: Snapshot, tiers: list[TierConfig], emergency: bool) -> PersistResult:
        commits: list[TierCommit] = []
        source: Path | None = None
        stall_reported = False
        for t in tiers:
            t0 = self._clock()
            try:
                store = self._stores[t.name]
                if isinstance(store, FileStore) and t.node_local:
                    path = str(
                        self._persister.to_files(snap, t, store, emergency=emergency, leader=self.link.leader)
                    )
                    if self.link.leader:
                        retain_node_files(store, t.keep)
                    self._replicate(Path(path), store.key)
                elif isinstance(store, FileStore):
                    path = str(self._persister.to_files(snap, t, store, emergency=emergency))
                    source = source or Path(path)
                    if self.rank == 0:
                        retain_files(store, t.keep)
                else:
                    path = self._persist_object(snap, t, store, source)
                ok, reason = True, ""
            except (PersistError, OSError) as exc:
                ok, path, reason = False, "", str(exc)
            dt = self._clock() - t0
            commits.append(TierCommit(t.name, ok, path, dt, reason))
            if not ok:
                if self.rank == 0:
                    self._sink(
                        CheckpointPersistFailed(ts=self._wall(), step=snap.step, tier=t.name, reason=reason)
                    )
                continue
            self.last_persist_s[t.name] = dt
            if t.durable:
                with self._lock:
                    self._durable_step = max(self._durable_step or -1, snap.step)
            if self.rank == 0:
                self._sink(
                    CheckpointCommitted(
                        ts=self._wall(),
                        step=snap.step,
                        path=path,
                        stall_s=0.0 if stall_reported else snap.stall_s,
                        persist_s=dt,
                        bytes=snap.bytes,
                        tier=t.name,
                        emergency=emergency,
                    )
                )
            stall_reported = True
        return PersistResult(snap.step, tuple(commits), emergency)

    def _replicate(self, version: Path, key: bytes | None) -> None:
        """Collective: send this node's files of a node-local version to the successor node. A
        failure is reported (the version stays committed on this node, without a second copy)."""
        peer = self.link.successor()
        if self.comm.all_gather(peer is not None) != [True] * self.world_size:
            return
        t0 = self._clock()
        manifest, why = read_manifest(version, key)
        files = size = 0
        if manifest is None:
            reason = f"cannot read the committed manifest: {why}"
        else:
            files, size, reason = send_files(self.link, version, manifest, self.rank)
        reasons = [f"rank {r}: {x}" for r, x in enumerate(self.comm.all_gather(reason)) if x]
        if not reasons and self.link.leader:
            reason = send_manifest(self.link, version)
        reasons += [
            f"rank {r}: {x}" for r, x in enumerate(self.comm.all_gather(reason if not reasons else "")) if x
        ]
        if self.link.leader:  # one event per node: its copy on its successor
            self._sink(
                PeerReplicated(
                    ts=self._wall(),
                    step=manifest.step if manifest else -1,
                    peer=peer.node if peer else "",
                    files=files,
                    bytes=size,
                    duration_s=self._clock() - t0,
                    ok=not reasons,
                    reason=reasons[0] if reasons else "",
                )
            )

    def _persist_object(self, snap: Snapshot, t: TierConfig, store: FsspecStore, source: Path | None) -> str:
        scratch = source is None
        if scratch:
            source = self._persister.to_files(snap, t, self._scratch, emergency=False)
        try:
            dest = ""
            if self.rank == 0:
                dest = self._persister.to_object(snap.step, source, store)  # type: ignore[arg-type]
                retain_object(store, t.keep)
        finally:
            if scratch and self.rank == 0:
                self._scratch.delete(snap.step)
        return dest

    # --- emergency ---------------------------------------------------------------------------

    def emergency_persist(self, deadline_s: float) -> EmergencyResult:
        """Make the newest staged snapshot durable within ``deadline_s``. Waits for an in-flight
        persist that already covers it. At world size 1 it may be called inside a signal handler;
        with several ranks call it on every rank at a step boundary (the handler sets a flag), so
        that no rank is mid-stage while another is not."""
        t0 = self._clock()
        snap = self._latest
        durable = [t for t in self.tiers if t.durable and t.is_file] or [t for t in self.tiers if t.durable]
        result: EmergencyResult
        if snap is None:
            result = self._emergency_copy(durable, deadline_s, t0)
        elif not durable:
            result = EmergencyResult(snap.step, False, "", 0.0, "no durable tier configured")
        elif self._durable_step is not None and self._durable_step >= snap.step:
            result = EmergencyResult(
                snap.step, True, "", self._clock() - t0, f"step {snap.step} was already durable"
            )
        else:
            fut: Future[PersistResult]
            inflight = self._inflight
            if (
                inflight
                and not inflight[0].done()
                and inflight[1] == snap.step
                and any(self.tier(n).durable for n in inflight[2])
            ):
                fut, how = inflight[0], "joined the running persist"
            else:
                fut, how = (
                    self.save_async(snap, [durable[0].name], emergency=True),
                    f"persisted to {durable[0].name}",
                )
            try:
                res = fut.result(timeout=max(0.0, deadline_s - (self._clock() - t0)))
                tier = next((n for n in res.committed if self.tier(n).durable), "")
                ok = bool(tier)
                reason = (
                    how if ok else "persist failed: " + "; ".join(c.reason for c in res.commits if not c.ok)
                )
                result = EmergencyResult(snap.step, ok, tier, self._clock() - t0, reason)
            except FutureTimeout:
                result = EmergencyResult(
                    snap.step,
                    False,
                    "",
                    self._clock() - t0,
                    f"deadline {deadline_s:.1f}s exceeded; the persist continues in background",
                )
        if self.rank == 0:
            self._sink(
                EmergencyCheckpoint(
                    ts=self._wall(),
                    step=result.step,
                    deadline_s=deadline_s,
                    duration_s=result.duration_s,
                    committed=result.committed,
                    tier=result.tier,
                    reason=result.reason,
                )
            )
        return result

    def _emergency_copy(self, durable: list[TierConfig], deadline_s: float, t0: float) -> EmergencyResult:
        """No consistent staged snapshot (the signal came while staging): copy the newest committed
        memory-tier version to the fastest durable file tier instead."""
        mem = [
            (step, p) for t in self.tiers if t.kind == "memory" for step, p in self._stores[t.name].versions()
        ]  # type: ignore[misc]
        target = next((t for t in durable if t.is_file), None)
        newest = max(mem, default=None)
        if target is None or newest is None or (self._durable_step or -1) >= newest[0]:
            why = "no consistent staged snapshot (none taken, or the signal arrived while staging) and " + (
                "no newer version in a memory tier" if target else "no durable file tier"
            )
            done = newest is not None and (self._durable_step or -1) >= newest[0]
            return EmergencyResult(
                newest[0] if done else -1,
                done,
                "",
                self._clock() - t0,
                f"step {newest[0]} was already durable" if done else why,
            )
        store = self._stores[target.name]

        def work() -> PersistResult:
            ok, reason, path = True, "", ""
            if self.rank == 0:
                try:
                    path = str(copy_version(Path(newest[1]), store, emergency=True))  # type: ignore[arg-type]
                except (PersistError, OSError) as exc:
                    ok, reason = False, str(exc)
            ok, reason = self.comm.broadcast((ok, reason))
            if ok:
                with self._lock:
                    self._durable_step = max(self._durable_step or -1, newest[0])
            return PersistResult(
                newest[0], (TierCommit(target.name, ok, path, self._clock() - t0, reason),), True
            )

        try:
            res = self._executor.submit(work).result(timeout=max(0.0, deadline_s - (self._clock() - t0)))
        except FutureTimeout:
            return EmergencyResult(
                newest[0],
                False,
                "",
                self._clock() - t0,
                f"deadline {deadline_s:.1f}s exceeded copying the memory tier",
            )
        c = res.commits[0]
        why = f"copied committed memory-tier step {newest[0]} to {target.name} (signal arrived while staging)"
        return EmergencyResult(
            newest[0],
            c.ok,
            target.name if c.ok else "",
            self._clock() - t0,
            why if c.ok else f"copy failed: {c.reason}",
        )

    # --- load --------------------------------------------------------------------------------

    def candidates(self) -> list[tuple[int, str, str]]:
        """(step, tier, location), newest step first and, for one step, fastest tier first."""
        out = []
        for t in self.tiers:
            for step, loc in self._stores[t.name].versions():
                out.append((step, SPEED_ORDER[t.kind], t.name, str(loc)))
        out.sort(key=lambda c: (-c[0], c[1]))
        return [(s, n, loc) for s, _, n, loc in out]

    def _local_path(self, step: int, tier: str, loc: str) -> Path:
        store = self._stores[tier]
        if isinstance(store, FsspecStore):
            dest = self._fetch_dir / tier / step_name(step)
            if self.rank == 0:
                store.fetch(step, dest)
            self.comm.barrier()
            return dest
        return Path(loc)

    def _all_candidates(self) -> list[tuple[int, str, str]]:
        """Rank 0's candidates, plus the versions of node-local tiers any node has; with peers, the
        newest step of any tier is also looked for in the node-local tiers (a peer may hold it)."""
        node_local = {t.name for t in self.tiers if t.node_local}
        gathered = self.comm.all_gather(self.candidates())
        seen = {(s, n) for c in gathered for s, n, _ in c if n in node_local}
        if gathered[0] and self.link.successor() is not None:
            seen |= {(gathered[0][0][0], n) for n in node_local}
        out = {(s, n): loc for s, n, loc in gathered[0]}
        for s, n in seen:
            out.setdefault((s, n), str(self._stores[n].final(s)))  # type: ignore[union-attr]
        order = {t.name: SPEED_ORDER[t.kind] for t in self.tiers}
        return [(s, n, loc) for (s, n), loc in sorted(out.items(), key=lambda c: (-c[0][0], order[c[0][1]]))]

    def _node_path(self, step: int, tier: str) -> tuple[Path, str, str, str]:
        """A node-local version made complete on this node by its leader:
        (path, the job's source, this node's source, reason); a source is "memory" or "peer"."""
        res = None
        if self.link.leader:
            res = assemble(self.link, self._stores[tier], step, clock=self._clock)  # type: ignore[arg-type]
        gathered = self.comm.all_gather(res)
        mine = gathered[self.rank + self.link.leader_rank_offset]
        if mine is None:
            return Path(), "", "", f"no result from this node's leader (local rank 0) for rank {self.rank}"
        sources = {g.source for g in gathered if g is not None and not g.reason}
        return Path(mine.path), "peer" if "peer" in sources else "memory", mine.source, mine.reason

    def load_latest(self, target_state: dict[str, Any]) -> EngineLoad | None:
        """Load, in place into ``target_state``, the newest version that verifies (resharding to
        this world size). Every version skipped is a CheckpointRejected event with its reason."""
        self.wait()
        t0 = self._clock()
        cands = self.comm.broadcast(self._all_candidates())
        rejected: list[str] = []
        node_local = {t.name for t in self.tiers if t.node_local}
        for step, tier, loc in cands:
            source = node_source = tier
            if tier in node_local:
                path, source, node_source, reason = self._node_path(step, tier)
                manifest = None
                if not reason:
                    manifest, reason = read_manifest(path, self._stores[tier].key)
                if manifest is not None:  # the leader verified every file; each rank checks its stride
                    names = sorted(manifest.files)[self.link.local_rank :: self.link.local_world]
                    reason = check_metadata(path, names)
            else:
                path = self._local_path(step, tier, loc)
                manifest, reason = read_manifest(path, self._stores[tier].key)
                if manifest is not None:
                    names = sorted(manifest.files)[self.rank :: self.world_size]
                    reason = verify_files(path, manifest, names) or check_metadata(path, names)
            reasons = [f"rank {r}: {x}" for r, x in enumerate(self.comm.all_gather(reason)) if x]
            if reasons:
                rejected.append(f"{tier} {step_name(step)}: {reasons[0]}")
                if self.rank == 0:
                    self._sink(
                        CheckpointRejected(
                            ts=self._wall(), path=str(loc), reason=f"{tier}: {reasons[0]}", step=step
                        )
                    )
                continue
            assert manifest is not None
            rank_state, src, reason = self._read_rank_state(path, manifest)
            reasons = [f"rank {r}: {x}" for r, x in enumerate(self.comm.all_gather(reason)) if x]
            if reasons:  # refused extras (e.g. a pickled object): fall back like any other bad version
                rejected.append(f"{tier} {step_name(step)}: {reasons[0]}")
                if self.rank == 0:
                    self._sink(
                        CheckpointRejected(
                            ts=self._wall(), path=str(loc), reason=f"{tier}: {reasons[0]}", step=step
                        )
                    )
                continue
            safe = SafeLoad(path)
            try:
                if target_state:
                    dcp.load(target_state, process_group=self.comm.group, **safe.kwargs)
            except (Exception, CheckpointException) as exc:
                if why := safe.refused(
                    exc
                ):  # every rank gets DCP's same exception, so all fall back together
                    rejected.append(f"{tier} {step_name(step)}: {why}")
                    if self.rank == 0:
                        self._sink(
                            CheckpointRejected(
                                ts=self._wall(), path=str(loc), reason=f"{tier}: {why}", step=step
                            )
                        )
                    continue
                raise CheckpointError(
                    f"checkpoint {path} verified but does not fit the state to load: {describe(exc)}",
                    "load with the same state layout (model/optimizer keys) it was saved with",
                ) from exc
            dt = self._clock() - t0
            if self.rank == 0 or (self.link.leader and node_source == "peer"):  # a node that fetched says so
                self._sink(
                    CheckpointLoaded(
                        ts=self._wall(),
                        step=step,
                        path=str(loc),
                        duration_s=dt,
                        tier=source if self.rank == 0 else node_source,
                    )
                )
            return EngineLoad(
                step, str(loc), source, rank_state, dt, manifest.world_size, tuple(rejected), str(path), src
            )
        return None

    def _read_rank_state(self, path: Path, manifest: Any) -> tuple[Any, int, str]:
        """This rank's extras, or (world size changed, this rank is new) those of rank
        ``rank % saved world size``. Tensors and plain data only: ``weights_only=True`` refuses
        any pickled object, which rejects the whole version. Returns (state, source rank, reason)."""
        source = self.rank % max(1, manifest.world_size)
        name = f"rank-{source}.pt"
        if name not in manifest.files:
            return None, -1, ""
        try:
            return load_torch_file(path / name), source, ""
        except UnsafeCheckpoint as exc:
            return None, source, f"{name} holds more than tensors and plain data: {exc.message}"
        except Exception as exc:  # damaged past what the digest caught: reject, never crash the load
            return None, source, f"{name} cannot be read: {refusal_line(exc)}"

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
