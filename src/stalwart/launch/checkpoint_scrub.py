"""Background verification of committed checkpoints, agent side: a thread that re-reads this node's
committed versions against their manifests, sets a damaged one aside before a recovery needs it, and
says so (a ``CheckpointDamaged`` event in a ledger file of its own, and the console).

The thread runs at a lowered CPU priority, in the agent's process, never in a worker's: the training
loop does not wait for it. Which version to read next and when (at most ``Budget.duty`` of one CPU,
each clean version again after ``Budget.recheck_s``) is policy/checkpoint_scrub.py's decision; the
reading and the setting aside are checkpoint/scrub.py's.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint.background import lower_thread_priority
from ..checkpoint.manifest import configured_key
from ..checkpoint.scrub import identity, read_version, set_aside
from ..checkpoint.store import committed_versions
from ..errors import StalwartError
from ..events import Event
from ..events.checkpoint import CheckpointDamaged, CheckpointsVerified
from ..ledger import LedgerWriter
from ..policy.checkpoint_scrub import (
    Budget,
    Identity,
    ScrubAction,
    ScrubOutcome,
    ScrubStep,
    Version,
    fallback_line,
    judge,
    next_verification,
    recovery_order,
    rest_until,
)
from ..protocol.run_dir import RunDir

POLL_S = 0.25  # how soon a new version is noticed while the budget allows a reading
NICE = 10  # the persist thread's own lowering


@dataclass(frozen=True)
class ScrubTier:
    """One tier the workers' engine writes on this node, named as the engine names it."""

    name: str
    root: Path
    speed: int  # 0: fastest (memory)
    node_local: bool = False  # holds only this node's files (the rest are on their own nodes)
    verify: Callable[[], bool] = lambda: True  # False: listed for the fallback, read by another node


Listed = dict[tuple[str, int], tuple[ScrubTier, Path]]  # (tier, step) -> the tier and where the version is


@dataclass
class ScrubStats:
    """What the scrubber did, for the ledger's readers and the benchmark."""

    readings: int = 0
    bytes: int = 0
    cpu_s: float = 0.0  # CPU time spent reading
    damaged: int = 0
    errors: list[str] = field(default_factory=list)


class CheckpointScrub:
    """``poll()`` is one bounded round (at most one version read); ``start``/``stop`` run it on a
    thread."""

    def __init__(
        self,
        tiers: Sequence[ScrubTier],
        *,
        run: RunDir,
        node: str,
        run_id: str,
        notify: Callable[[Event], None] = lambda ev: None,
        attempt: Callable[[], int] = lambda: -1,
        budget: Budget | None = None,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
        settle: Callable[[], None] | None = None,
        key: bytes | None = None,
    ) -> None:
        self.tiers = tuple(tiers)
        self.run, self.node, self.run_id = run, node, run_id
        self.notify, self.attempt = notify, attempt
        self.budget = budget or Budget()
        self.wall, self.mono, self.cpu = wall, mono, cpu
        self._settle = settle
        self.key = key if key is not None else configured_key()
        self.stats = ScrubStats()
        # (tier, step) -> the version's identity and when it was last known good
        self._known: dict[tuple[str, int], tuple[Identity | None, float]] = {}
        self._rested = 0.0
        self._writer: LedgerWriter | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- one round ---------------------------------------------------------------------------

    def _listed(self) -> Listed:
        out = {}
        for tier in self.tiers:
            try:
                versions = committed_versions(tier.root)
            except OSError:
                continue  # not there yet, or being replaced: the next round lists it again
            out.update({(tier.name, step): (tier, path) for step, path in versions})
        return out

    def _versions(self, listed: Listed, now: float) -> list[Version]:
        """The listed versions, each with when it was last known good. A version first seen now was
        verified by its persist, which hashed the files it had just written; a version saved again
        under its step (a new identity) is seen anew."""
        self._known = {
            k: known
            for k, known in self._known.items()
            if k in listed and known[0] is not None and known[0] == identity(listed[k][1])
        }
        out = []
        for key, (tier, path) in listed.items():
            if key not in self._known:
                self._known[key] = (identity(path), now)
            out.append(Version(tier.name, tier.speed, key[1], self._known[key][1]))
        return out

    def poll(self) -> float:
        """Read at most one version (more after a damage: see :meth:`_damage_found`); returns the
        monotonic time to poll again."""
        now = self.mono()
        listed = self._listed()
        versions = self._versions(listed, now)
        mine = [v for v in versions if listed[(v.tier, v.step)][0].verify()]
        decision = next_verification(mine, now=now, rested_at=self._rested, budget=self.budget)
        if decision.action is ScrubAction.WAIT or decision.version is None:
            return min(decision.until, now + POLL_S)
        used = self.cpu()
        outcome, problem = self._read(decision.version, listed)
        if outcome.step is ScrubStep.SET_ASIDE:
            self._damage_found(decision.version, problem, listed)
        used = self.cpu() - used  # this thread's: waiting for the CPU or for a version to settle is free
        self.stats.cpu_s += used
        self._rested = rest_until(now, used, self.budget.duty)
        return self._rested  # the next reading as soon as the budget allows it

    def _read(self, version: Version, listed: Listed) -> tuple[ScrubOutcome, str]:
        """Read one version and keep what it showed: (the outcome, the problem found)."""
        key = (version.tier, version.step)
        tier, path = listed[key]
        settle = {} if self._settle is None else {"settle": self._settle}
        got = read_version(path, self.key, present_only=tier.node_local, **settle)
        self.stats.readings += 1
        self.stats.bytes += got.bytes
        outcome = judge(version, got.reading)
        if outcome.step is ScrubStep.KEEP:
            self._known[key] = (got.reading.after, self.mono())
        else:
            self._known.pop(key, None)
        return outcome, got.reading.problem

    def _damage_found(self, first: Version, problem: str, listed: Listed) -> None:
        """Set ``first`` aside, after reading what a recovery would read instead until one verifies
        (damage seldom comes alone: every tier's copy of a version holds the same bytes, one disk holds
        several versions), so what the console says of the fallback is known, not hoped."""
        key = (first.tier, first.step)
        found = [(first, listed[key][1], problem)]
        listed = self._listed()  # as it is now: a newer version may have committed during the reading
        left = [v for v in self._versions(listed, self.mono()) if (v.tier, v.step) != key]
        nxt: Version | None = None
        verified = False
        while left:
            nxt = recovery_order(left)[0]
            if not listed[(nxt.tier, nxt.step)][0].verify():
                break  # another node reads that tier
            outcome, why = self._read(nxt, listed)
            if outcome.step is ScrubStep.KEEP:
                verified = True
                break
            left.remove(nxt)
            if outcome.step is ScrubStep.SET_ASIDE:
                found.append((nxt, listed[(nxt.tier, nxt.step)][1], why))
            nxt = None
        for version, path, why in found:
            self._set_aside(version, path, why, fallback_line(nxt, verified))

    def _set_aside(self, version: Version, path: Path, problem: str, fallback: str) -> None:
        self.stats.damaged += 1
        try:
            moved, why = str(set_aside(path)), ""
        except OSError as exc:
            moved, why = (
                "",
                f"; it could not be set aside ({exc.strerror or exc}): a recovery rejects it on load",
            )
        ev = CheckpointDamaged(
            ts=self.wall(),
            step=version.step,
            tier=version.tier,
            path=str(path),
            reason=problem + why,
            set_aside=moved,
            fallback=fallback,
            run_id=self.run_id,
            node=self.node,
            attempt=self.attempt(),
        )
        self._write(ev)
        self.notify(ev)

    def _write(self, ev: Event) -> None:
        if self._writer is None:
            self._writer = LedgerWriter(
                self.run.scrub_ledger(self.node, os.getpid()), writer=f"scrub {self.node}"
            )
        try:
            self._writer.append(ev)
        except StalwartError as exc:
            self.stats.errors.append(exc.message)

    # --- thread ------------------------------------------------------------------------------

    def _round(self) -> float:
        try:
            return self.poll()
        except Exception as exc:  # noqa: BLE001 - verification must never take the job down
            msg = f"checkpoint verification round failed: {type(exc).__name__}: {exc}"
            if msg not in self.stats.errors:
                self.stats.errors.append(msg)
            return self.mono() + POLL_S

    def _run(self) -> None:
        lower_thread_priority(NICE)
        delay = 0.0
        while not self._stop.wait(delay):
            delay = max(0.0, self._round() - self.mono())

    def start(self) -> CheckpointScrub:
        self._thread = threading.Thread(target=self._run, name="stalwart-scrub", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (a reading in progress ends first), record what it did, close its ledger."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._thread is not None and self._thread.is_alive():
            return  # a reading outlived the wait: the daemon thread ends with the agent
        st = self.stats
        self._write(
            CheckpointsVerified(
                ts=self.wall(),
                readings=st.readings,
                bytes=st.bytes,
                cpu_s=st.cpu_s,
                damaged=st.damaged,
                duty=self.budget.duty,
                run_id=self.run_id,
                node=self.node,
                attempt=self.attempt(),
            )
        )
        if self._writer is not None:
            self._writer.close()
            self._writer = None
