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
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ..errors import CheckpointError
from ..events import CheckpointCommitted, CheckpointLoaded, CheckpointRejected, CheckpointStaged, Event
from .collective import Collective
from .events import CheckpointPersistFailed, EmergencyCheckpoint
from .manifest import read_manifest, verify_files
from .persist import (
    Persister,
    PersistError,
    WriterFactory,
    copy_version,
    default_writer,
    describe,
    retain_files,
    retain_object,
)
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
    ) -> None:
        self.tiers = validate_tiers(list(tiers))
        self.rank = rank
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
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="stalwart-ckpt",
            initializer=_lower_thread_priority,
            initargs=(persist_nice,),
        )
        self._inflight: tuple[Future[PersistResult], int, tuple[str, ...]] | None = None
        self._latest: Snapshot | None = None
        self._lock = threading.Lock()
        self._durable_step: int | None = None
        self.last_persist_s: dict[str, float] = {}
        self.last_stall_s: float | None = None
        if rank == 0:
            for s in self._stores.values():
                if isinstance(s, FileStore):
                    s.sweep_partials()
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
                if isinstance(store, FileStore):
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

    def load_latest(self, target_state: dict[str, Any]) -> EngineLoad | None:
        """Load, in place into ``target_state``, the newest version that verifies (resharding to
        this world size). Every version skipped is a CheckpointRejected event with its reason."""
        self.wait()
        t0 = self._clock()
        cands = self.comm.broadcast(self.candidates() if self.rank == 0 else None)
        rejected: list[str] = []
        for step, tier, loc in cands:
            path = self._local_path(step, tier, loc)
            manifest, reason = read_manifest(path)
            if manifest is not None:
                names = sorted(manifest.files)[self.rank :: self.world_size]
                reason = verify_files(path, manifest, names)
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
            try:
                if target_state:
                    dcp.load(target_state, checkpoint_id=str(path), process_group=self.comm.group)
            except (Exception, CheckpointException) as exc:
                raise CheckpointError(
                    f"checkpoint {path} verified but does not fit the state to load: {describe(exc)}",
                    "load with the same state layout (model/optimizer keys) it was saved with",
                ) from exc
            rank_file = f"rank-{self.rank}.pt"
            rank_state = (
                torch.load(path / rank_file, weights_only=False) if rank_file in manifest.files else None
            )
            dt = self._clock() - t0
            if self.rank == 0:
                self._sink(
                    CheckpointLoaded(ts=self._wall(), step=step, path=str(loc), duration_s=dt, tier=tier)
                )
            return EngineLoad(
                step, str(loc), tier, rank_state, dt, manifest.world_size, tuple(rejected), str(path)
            )
        return None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
