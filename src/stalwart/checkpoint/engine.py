"""The checkpoint engine: stage (the only stall), persist in the background to tiers, verified load.

Typical use in a training loop::

    engine = CheckpointEngine(default_tiers(local_dir="ckpt", job="run1"), rank=r, world_size=w)
    found = engine.load_latest(state)           # in place, reshards if the world size changed
    for step in ...:
        ...
        engine.save(step, state, rank_state)    # returns after the host copy; persist runs behind
    engine.close()

All ranks call ``save``, ``load_latest``, ``emergency_persist`` and the constructor together.
The persist path lives in :mod:`.tier_writer`, the load path (the tier walk) in :mod:`.tier_walk`,
retention in :mod:`.persist`; the result types in :mod:`.outcomes` are re-exported here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from typing_extensions import assert_never

from ..errors import CheckpointError
from ..events import CheckpointStaged
from ..events.checkpoint import EmergencyCheckpoint
from ..policy.label import Label
from .background import Background, lower_thread_priority
from .collective import Collective
from .node_tier import NodeLink
from .outcomes import (
    EmergencyResult,
    EngineLoad,
    EngineParts,
    PersistResult,
    SaveTicket,
    Sink,
    TierCommit,
)
from .persist import Persister, PersistError, WriterFactory, copy_version, default_writer
from .staging import Snapshot, Stager
from .store import FileStore, FsspecStore
from .tier_walk import Candidate, TierWalk
from .tier_writer import TierWriter
from .tiers import TierConfig, TierKind, validate_tiers

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "CheckpointEngine",
    "EmergencyResult",
    "EngineLoad",
    "OnBusy",
    "PersistResult",
    "SaveTicket",
    "Sink",
    "TierCommit",
]


class OnBusy(Label):
    """What ``save`` does when the previous persist still runs: skip this save, or wait for it."""

    SKIP = "skip"
    WAIT = "wait"


class CheckpointEngine:
    def __init__(
        self,
        tiers: Sequence[TierConfig],
        *,
        rank: int = 0,
        world_size: int = 1,
        process_group: ProcessGroup | None = None,
        sink: Sink | None = None,
        stager: Stager | None = None,
        writer_factory: WriterFactory = default_writer,
        on_busy: OnBusy | Literal["skip", "wait"] = OnBusy.SKIP,
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
        self.on_busy = OnBusy(on_busy)
        self._clock = clock
        self._wall = wall
        self.comm = Collective.create(world_size, process_group)
        self.stager = stager or Stager(clock=clock)
        stores: dict[str, FileStore | FsspecStore] = {
            t.name: FileStore(t.location, fsync=t.do_fsync) if t.is_file else FsspecStore(t.location)
            for t in self.tiers
        }
        self._parts = EngineParts(
            rank=rank,
            world_size=world_size,
            comm=self.comm,
            link=self.link,
            stores=stores,
            sink=sink or (lambda ev: None),
            clock=clock,
            wall=wall,
        )
        first_file = next((t for t in self.tiers if t.is_file), None)
        base = (
            Path(fetch_dir) if fetch_dir else (Path(first_file.location) if first_file else Path(".stalwart"))
        )
        scratch = FileStore(base / ".object-staging", fsync=False)
        persister = Persister(
            rank=rank, world_size=world_size, comm=self.comm, writer_factory=writer_factory, clock=wall
        )
        self._writer = TierWriter(self._parts, persister, scratch)
        self._walk = TierWalk(self._parts, base / ".fetch")
        self._last: dict[str, int | None] = {t.name: None for t in self.tiers}
        self._executor = Background("stalwart-ckpt", lower_thread_priority, (persist_nice,))
        self._inflight: tuple[Future[PersistResult], int, tuple[str, ...]] | None = None
        self._latest: Snapshot | None = None
        self.last_stall_s: float | None = None
        for t in self.tiers:
            s = stores[t.name]
            if isinstance(s, FileStore) and (self.link.leader if t.node_local else rank == 0):
                s.sweep_partials()
        if rank == 0:
            scratch.sweep_partials()
        self.comm.barrier()

    @property
    def last_persist_s(self) -> dict[str, float]:
        """Seconds the last successful persist to each tier took."""
        return self._writer.last_persist_s

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
        self,
        step: int,
        # Any: torch state_dict values and the user's per-rank object (anything torch.save pickles)
        state: dict[str, Any],
        rank_state: Any = None,
        *,
        _t0: float | None = None,
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
            self._parts.sink(
                CheckpointStaged(ts=self._wall(), step=step, stall_s=snap.stall_s, bytes=snap.bytes)
            )
        return snap

    def save_async(
        self, snap: Snapshot, tiers: Sequence[str] | None = None, *, emergency: bool = False
    ) -> Future[PersistResult]:
        names = tuple(tiers) if tiers is not None else tuple(t.name for t in self.tiers)
        chosen = [self.tier(n) for n in names]
        fut = self._executor.submit(self._writer.persist, snap, chosen, emergency)
        self._inflight = (fut, snap.step, names)
        return fut

    def save(
        self,
        step: int,
        state: dict[str, Any],  # Any: torch state_dict values (tensors, nested containers, user objects)
        rank_state: Any = None,  # Any: a per-rank object of the user's, anything torch.save pickles
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
            match self.on_busy:
                case OnBusy.SKIP:
                    return SaveTicket(
                        step,
                        self._clock() - t0,
                        0,
                        (),
                        None,
                        skipped="previous persist still running; interval shorter than persist time",
                    )
                case OnBusy.WAIT:
                    self.wait()
                case _:
                    assert_never(self.on_busy)
        snap = self.stage(step, state, rank_state, _t0=t0)
        for t in due:
            self._last[t.name] = step
        fut = self.save_async(snap, [t.name for t in due], emergency=emergency)
        return SaveTicket(step, snap.stall_s, snap.bytes, tuple(t.name for t in due), fut)

    def wait(self, timeout: float | None = None) -> PersistResult | None:
        if self._inflight is None:
            return None
        return self._inflight[0].result(timeout)

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
        elif self._parts.durable.covers(snap.step):
            result = EmergencyResult(
                snap.step, True, "", self._clock() - t0, f"step {snap.step} was already durable"
            )
        else:
            result = self._emergency_snapshot(snap, durable[0], deadline_s, t0)
        if self.rank == 0:
            self._parts.sink(
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

    def _emergency_snapshot(
        self, snap: Snapshot, target: TierConfig, deadline_s: float, t0: float
    ) -> EmergencyResult:
        """Persist the staged snapshot to ``target`` (or join a running persist that covers it)."""
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
            fut, how = self.save_async(snap, [target.name], emergency=True), f"persisted to {target.name}"
        try:
            res = fut.result(timeout=max(0.0, deadline_s - (self._clock() - t0)))
        except FutureTimeout:
            return EmergencyResult(
                snap.step,
                False,
                "",
                self._clock() - t0,
                f"deadline {deadline_s:.1f}s exceeded; the persist continues in background",
            )
        tier = next((n for n in res.committed if self.tier(n).durable), "")
        ok = bool(tier)
        reason = how if ok else "persist failed: " + "; ".join(c.reason for c in res.commits if not c.ok)
        return EmergencyResult(snap.step, ok, tier, self._clock() - t0, reason)

    def _emergency_copy(self, durable: list[TierConfig], deadline_s: float, t0: float) -> EmergencyResult:
        """No consistent staged snapshot (the signal came while staging): copy the newest committed
        memory-tier version to the fastest durable file tier instead."""
        stores = self._parts.stores
        mem: list[tuple[int, Path | str]] = [
            (step, p)
            for t in self.tiers
            if t.tier_kind is TierKind.MEMORY
            for step, p in stores[t.name].versions()
        ]
        target = next((t for t in durable if t.is_file), None)
        newest = max(mem, default=None)
        durable_step = self._parts.durable.step
        if newest is not None and (durable_step or -1) >= newest[0]:
            return EmergencyResult(
                newest[0], True, "", self._clock() - t0, f"step {newest[0]} was already durable"
            )
        if target is None or newest is None:
            why = "no consistent staged snapshot (none taken, or the signal arrived while staging) and " + (
                "no newer version in a memory tier" if target else "no durable file tier"
            )
            return EmergencyResult(-1, False, "", self._clock() - t0, why)
        store = stores[target.name]
        assert isinstance(store, FileStore), "a durable tier that is a file tier has a file store"
        step, src = newest[0], Path(newest[1])

        def work() -> PersistResult:
            ok, reason, path = True, "", ""
            if self.rank == 0:
                try:
                    path = str(copy_version(src, store, emergency=True))
                except (PersistError, OSError) as exc:
                    ok, reason = False, str(exc)
            ok, reason = self.comm.broadcast_outcome(ok, reason)
            if ok:
                self._parts.durable.raise_to(step)
            return PersistResult(step, (TierCommit(target.name, ok, path, self._clock() - t0, reason),), True)

        try:
            res = self._executor.submit(work).result(timeout=max(0.0, deadline_s - (self._clock() - t0)))
        except FutureTimeout:
            return EmergencyResult(
                step,
                False,
                "",
                self._clock() - t0,
                f"deadline {deadline_s:.1f}s exceeded copying the memory tier",
            )
        c = res.commits[0]
        why = f"copied committed memory-tier step {step} to {target.name} (signal arrived while staging)"
        return EmergencyResult(
            step,
            c.ok,
            target.name if c.ok else "",
            self._clock() - t0,
            why if c.ok else f"copy failed: {c.reason}",
        )

    # --- load --------------------------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """(step, tier, location), newest step first and, for one step, fastest tier first."""
        return self._walk.candidates(self.tiers)

    # Any: torch state_dict values (tensors, nested containers, user objects)
    def load_latest(self, target_state: dict[str, Any], max_step: int | None = None) -> EngineLoad | None:
        """Load, in place into ``target_state``, the newest version that verifies (resharding to
        this world size), of a step no later than ``max_step`` when given (a rollback). Every
        version skipped is a CheckpointRejected event with its reason."""
        self.wait()
        return self._walk.load_latest(self.tiers, target_state, max_step)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
