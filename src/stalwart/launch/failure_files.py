"""The run files about failures: each rank's error record (the SDK's, or torch elastic's ``@record``
file), its log's last traceback, the stack dumps of a hang, and the newest good checkpoint a verdict
names."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from ..chaos.once import injected_by
from ..diagnose.pyspy import STOPPED_STATES, process_state, stopped_stacks
from ..events import JobEnded
from ..ledger import read_available
from ..protocol.error_record import ErrorRecord, error_from_log, read_elastic_error, read_error
from ..protocol.run_dir import RunDir
from .clock import Clock
from .processes.worker_group import tail_lines


class Spec(Protocol):
    @property
    def global_rank(self) -> int: ...


class Group(Protocol):
    @property
    def procs(self) -> Mapping[int, object]: ...

    def poll(self) -> dict[int, int | None]: ...

    def signal(self, signum: int) -> None: ...


class AttemptFiles:
    """Implements :class:`stalwart.launch.ports.FailureFiles` for one attempt of this node."""

    def __init__(
        self,
        run: RunDir,
        node: str,
        attempt: int,
        clock: Clock,
        group: Group,
        specs: Sequence[Spec],
        stop_grace_s: float,
        state_of: Callable[[int], str] = process_state,
    ) -> None:
        """``state_of``: a process's state letter from the kernel (injected for tests)."""
        self.run, self.node, self.attempt, self.clock = run, node, attempt, clock
        self.group, self.specs, self.stop_grace_s = group, list(specs), stop_grace_s
        self.state_of = state_of

    def _records(self, rank: int) -> tuple[Path, Path]:
        return (
            self.run.error_file(self.node, self.attempt, rank),
            self.run.elastic_error_file(self.node, self.attempt, rank),
        )

    def injected_by(self, pid: int) -> str:
        """The chaos plan entry that made process ``pid`` fail on purpose ("" when none did)."""
        return injected_by(self.run.chaos, pid)

    def error_of(self, rank: int, log: Path | None) -> ErrorRecord | None:
        """Root cause of a failed rank: the SDK's error file, torch elastic's ``@record`` file, or the
        last traceback in the rank's log."""
        mine, elastic = self._records(rank)
        err = read_error(mine)
        if err is None:
            err = read_elastic_error(elastic)
        if err is None and log is not None:
            self.clock.sleep(0.05)  # the output pumps may still be copying the last lines
            err = error_from_log(tail_lines(log, 400))
        return err

    def raised_since(self) -> dict[int, float]:
        """Rank -> the time it wrote this attempt's error record (stalwart's or torch elastic's)."""
        out: dict[int, float] = {}
        for s in self.specs:
            for path in self._records(s.global_rank):
                try:
                    out[s.global_rank] = min(out.get(s.global_rank, math.inf), path.stat().st_mtime)
                except OSError:
                    pass
        return out

    def raised_not_exited(self) -> dict[int, int]:
        """Ranks that recorded an exception in this attempt: a worker slow to exit after raising
        (on a loaded machine) is an exception, not a hang. Waits a bounded time for their exits."""
        ranks = [s.global_rank for s in self.specs if any(p.exists() for p in self._records(s.global_rank))]
        if not ranks:
            return {}
        deadline = self.clock.monotonic() + max(2.0, self.stop_grace_s)
        while self.clock.monotonic() < deadline and any(self.group.poll().get(r) is None for r in ranks):
            self.clock.sleep(0.05)
        codes = self.group.poll()
        return {r: c if c not in (None, 0) else 1 for r in ranks for c in (codes.get(r),)}

    def capture_stacks(self, wait_s: float = 0.5) -> dict[int, str]:
        """faulthandler in each worker dumps every thread's Python stack on SIGUSR2; a stopped rank
        cannot, and py-spy reads its stack from outside (diagnose/pyspy.py), within the stop grace.

        Waits ``wait_s`` for every rank's answer, and past it, while no more than half the ranks have
        answered and none of the silent ones is stopped, up to the stop grace: a hang is pinned only
        when most ranks answered or one is stopped (policy/hang_pin.py), and on a loaded machine a
        rank blocked in a collective can take longer than ``wait_s`` to be scheduled and write its
        stack."""
        paths = {r: self.run.stack_file(self.node, self.attempt, r) for r in self.group.procs}
        sizes = {r: (p.stat().st_size if p.exists() else 0) for r, p in paths.items()}
        pids = {r: getattr(p, "pid", -1) for r, p in self.group.procs.items()}
        self.group.signal(signal.SIGUSR2)
        start = self.clock.monotonic()
        soft, hard = start + wait_s, start + max(wait_s, self.stop_grace_s)
        out: dict[int, str] = {}

        def waiting() -> bool:
            now = self.clock.monotonic()
            if len(out) == len(paths) or now >= hard:
                return False
            if now < soft:
                return True
            silent = [pid for r, pid in pids.items() if r not in out and pid > 0]
            few = 2 * len(out) <= len(paths)
            return few and not any(self.state_of(pid) in STOPPED_STATES for pid in silent)

        while waiting():
            for r, p in paths.items():
                if r not in out and p.exists() and p.stat().st_size > sizes[r]:
                    self.clock.sleep(0.05)  # let the dump finish
                    with open(p) as fh:
                        fh.seek(sizes[r])
                        out[r] = fh.read()
            self.clock.sleep(0.02)
        silent = {r: pid for r, pid in pids.items() if r not in out and pid > 0}
        out.update(stopped_stacks(silent, self.stop_grace_s))
        return out


class CheckpointFiles:
    """Implements :class:`stalwart.launch.ports.RunFiles` over the run directory's checkpoints."""

    def __init__(self, run: RunDir, *, node: str = "", since: float = 0.0) -> None:
        self.run, self.node, self.since = run, node, since

    def finished_elsewhere(self) -> str:
        """What the run directory's ledger says when another node ended the job succeeded since this
        agent started (``since``); "" when none did or the ledger cannot be read."""
        try:
            events = read_available(self.run.root).events
        except Exception:  # noqa: BLE001 - no answer from the files: the store's failure stands
            return ""
        done = [
            e
            for e in events
            if isinstance(e, JobEnded)
            and e.outcome == "succeeded"
            and e.node != self.node
            and e.ts >= self.since
        ]
        if not done:
            return ""
        last = max(done, key=lambda e: e.ts)
        when = time.strftime("%H:%M:%S", time.localtime(last.ts))
        return f"the job already succeeded on {last.node} at {when} (the run directory's ledger says so)"

    def newest_good(self) -> int | None:
        """The newest checkpoint step in the run directory that verifies, or None."""
        from ..checkpoint.manifest import verify  # deferred: heavy (pydantic)
        from ..checkpoint.store import FileStore  # deferred: heavy (pydantic)

        try:
            for step, path in FileStore(self.run.checkpoints).versions():
                if verify(path)[0] is not None:
                    return step
        except Exception:  # noqa: BLE001 - a verdict must not fail on an unreadable checkpoint tree
            return None
        return None
