"""Chaos on the agent's side: faults of the fault plan that the agent itself injects once the workers
reach their step (kill this agent; damage the newest checkpoint, on disk and in the node memory tier)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Protocol

from ..chaos.once import claim
from ..chaos.plan import FaultPlan
from ..chaos.reach import Fired, needs_sdk, sdk_refusal, spec_of, unfired, unfired_line
from ..checkpoint.store import step_name
from ..events import ChaosInjected, ChaosUnfired, Event, StepCompleted
from ..protocol.run_dir import DISK_TIER, MEMORY_TIER, RunDir
from . import chaos_actions
from .clock import Clock
from .ports import LedgerSink
from .progress import ProgressTracker


class MemoryTier(Protocol):
    @property
    def versions_root(self) -> Path: ...

    def version_dir(self, name: str) -> Path | None: ...


class AgentChaos:
    """Implements :class:`stalwart.launch.ports.AttemptChaos`; lives as long as the job (a damage waits
    for its version's commit across the ticks of an attempt)."""

    def __init__(
        self,
        plan: FaultPlan,
        run: RunDir,
        ledger: LedgerSink,
        clock: Clock,
        memory: MemoryTier | None = None,
        kill=None,
    ) -> None:
        self.plan, self.run, self.ledger, self.clock, self.memory = plan, run, ledger, clock, memory
        self.group_rank = 0  # this node's place in the attempt's world (the launcher sets it)
        self.done_step = -1  # the newest step done that agent-side chaos has seen
        self.targets: dict[str, int] = {}  # checkpoint damage: the version step each aims at
        self._kill = kill or (lambda: os.kill(os.getpid(), signal.SIGKILL))
        self._needs_sdk = needs_sdk(plan)

    def tick(self, tracker: ProgressTracker) -> None:
        self.refuse_without_sdk(tracker)
        self.done_step = tracker.max_done_step
        self.at(tracker.max_done_step, settled=False)

    def refuse_without_sdk(self, tracker: ProgressTracker) -> None:
        """Faults only the SDK can take (checkpoint damage) and a rank that steps without a Session
        (its steps come from the bootstrap's hooks, it never said Hello): stop the job with the one
        error (FaultPlanError, exit 2) at that rank's first step, before training goes on. Only then
        is it known: a script's use of the SDK shows once its workers run."""
        if not self._needs_sdk:
            return
        for rank, p in sorted(tracker.progress.items()):
            if p.hooked and not p.session:
                raise sdk_refusal(self._needs_sdk, rank)

    def account(self, events: list[Event]) -> str:
        """At the run's end: the planned faults with no injection on record go into the ledger
        (``ChaosUnfired``, which the report shows); the console's line about them ("" if none)."""
        fired = [Fired(e.fault, e.rank, e.step) for e in events if isinstance(e, ChaosInjected)]
        missing = unfired(self.plan, fired)
        if not missing:
            return ""
        last = max((e.step for e in events if isinstance(e, StepCompleted)), default=-1)
        line = unfired_line(missing, last)
        self.ledger.emit(
            ChaosUnfired(
                ts=self.clock.now(), faults=tuple(spec_of(f) for f in missing), line=line, **self.ledger.ctx()
            ),
            show=False,
        )
        return line

    def settle(self) -> None:
        """The attempt failed: a damage that waited on a persist the failure cut short aims at the
        newest version that did commit."""
        self.at(self.done_step, settled=True)

    def at(self, done_step: int, *, settled: bool) -> None:
        """Agent-side faults due once step ``done_step + 1`` is reached. Checkpoint damage aims at the
        newest version when it is due, committed or still being persisted, and waits for that one's
        commit (``settled``: the workers are gone and nothing more will commit: the newest that did)."""
        for fault in self.plan.agent_faults():
            if fault.step is None or done_step + 1 < fault.step:
                continue
            if fault.kind == "kill-agent":
                if fault.node != self.group_rank or not claim(self.run.chaos, fault):
                    continue
                self._injected(fault, fault.describe())
                self._kill()
            elif self.group_rank == 0 and fault.on_failure:
                if settled:  # the workers are gone: nothing commits any more
                    self._damage_at_failure(fault)
            elif self.group_rank == 0:
                self._damage(fault, settled)

    def _damage(self, fault, settled: bool) -> None:
        disk = self.run.checkpoints
        faster = [self.memory.versions_root] if self.memory is not None else []
        key = fault.describe()
        if key not in self.targets:  # pin the newest version, committed or on its way
            newest = chaos_actions.newest_on_its_way(disk, faster)
            if newest >= 0:
                self.targets[key] = newest
        pinned = self.targets.get(key, -1)
        target = chaos_actions.committed(disk, pinned) if pinned >= 0 else None
        if target is None and not settled:
            return  # not on disk yet: wait for its commit (or for the attempt to fail)
        target = target or chaos_actions.newest_checkpoint(disk)
        if target is None or not claim(self.run.chaos, fault):
            return
        detail = chaos_actions.damage(target, fault.kind, DISK_TIER)
        mem = self.memory.version_dir(target.name) if self.memory is not None else None
        if mem is not None:  # and the node memory tier's copy of the same version
            detail += "; " + chaos_actions.damage(mem, fault.kind, MEMORY_TIER)
        self._injected(fault, detail)

    def _damage_at_failure(self, fault) -> None:
        """Damage the newest version committed in any tier, on disk and in the node memory tier alike."""
        disk = self.run.checkpoints
        faster = [self.memory.versions_root] if self.memory is not None else []
        step = chaos_actions.newest_committed(disk, faster)
        if step < 0 or not claim(self.run.chaos, fault):
            return
        on_disk = chaos_actions.committed(disk, step)
        mem = self.memory.version_dir(step_name(step)) if self.memory is not None else None
        copies = ((on_disk, DISK_TIER), (mem, MEMORY_TIER))
        done = [chaos_actions.damage(path, fault.kind, tier) for path, tier in copies if path is not None]
        self._injected(fault, "; ".join(done))

    def _injected(self, fault, detail: str) -> None:
        self.ledger.emit(
            ChaosInjected(
                ts=self.clock.now(), fault=fault.kind, step=fault.step, detail=detail, **self.ledger.ctx()
            )
        )
