"""Node records kept in ledger files (one writer file per node under a state directory)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from ..errors import LedgerError, LedgerNotReadyError
from ..events import Event
from ..events.node_health import NodeDrained, NodeStateChanged
from ..ledger import SUFFIX, LedgerWriter, check_format, read_available, set_aside
from ..node_name import validate_node_name
from .lifecycle import NodeRecord, NodeState

DEFAULT_STATE_DIR = Path("stalwart-runs/health")
log = logging.getLogger(__name__)
_STATES = {s.value for s in NodeState}


def local_node_name() -> str:
    """$SLURMD_NODENAME or the short host name, validated (it becomes a file name and a Slurm argument)."""

    env = os.environ.get("SLURMD_NODENAME")
    if env:
        return validate_node_name(env, "$SLURMD_NODENAME")
    return validate_node_name(socket.gethostname().split(".")[0], "the host name")


class HealthStore:
    def __init__(self, directory: str | Path = DEFAULT_STATE_DIR) -> None:
        self.directory = Path(directory)
        self.set_aside_files: list[Path] = []  # ledgers this store moved out of the way

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}")) if self.directory.is_dir() else []

    def _set_aside(self, path: Path, reason: str) -> None:
        try:
            target = set_aside(path)
        except OSError as exc:  # read-only state dir: skip it this time, still never block a start
            log.warning(
                "stalwart: warning: unreadable node ledger %s skipped (%s); cannot move it: %s",
                path,
                reason,
                exc.strerror,
            )
            return
        self.set_aside_files.append(target)
        log.warning(
            "stalwart: warning: unreadable node ledger %s set aside as %s: %s", path, target.name, reason
        )

    def events(self) -> list[Event]:
        """Events of every readable node ledger; a foreign or corrupt one is set aside, never fatal."""
        files = self._files()
        if not files:
            return []
        read = read_available(files, require_some=False)
        for sk in read.skipped:
            if sk.rows:
                log.warning(
                    "stalwart: warning: node ledger %s: %d unreadable row(s) skipped: %s",
                    sk.path,
                    sk.rows,
                    sk.reason,
                )
            elif not sk.not_ready:
                self._set_aside(sk.path, sk.reason)
        return read.events

    def records(self, events: Iterable[Event] | None = None) -> dict[str, NodeRecord]:
        out: dict[str, NodeRecord] = {}
        for ev in self.events() if events is None else events:
            if isinstance(ev, NodeStateChanged):
                if ev.to_state not in _STATES:
                    log.warning(
                        "stalwart: warning: node %r: unknown state %r in a ledger skipped",
                        ev.node,
                        ev.to_state,
                    )
                    continue
                out[ev.node] = NodeRecord(
                    node=ev.node,
                    state=NodeState(ev.to_state),
                    since=ev.ts,
                    reason=ev.state_reason or ev.reason,
                    strikes=ev.strikes,
                    fault_key=ev.fault_key,
                    recoverable=ev.recoverable,
                    needs_human=ev.needs_human,
                    readmitted_at=ev.readmitted_at,
                    readmitted_fault=ev.readmitted_fault,
                )
        return out

    def failure_mtbf(self, node: str, now: float, events: Iterable[Event] | None = None) -> float | None:
        """This node's mean time between failures from its history: the span of its record divided
        by the times it was quarantined; None when it never was (no history of failing says nothing
        about the rate, the caller's default applies)."""
        evs = [
            e
            for e in (self.events() if events is None else events)
            if isinstance(e, NodeStateChanged) and e.node == node
        ]
        faults = sum(1 for e in evs if e.to_state == NodeState.QUARANTINED.value)
        if not evs or faults == 0:
            return None
        return max(0.0, now - min(e.ts for e in evs)) / faults

    def excluded(self) -> set[str]:
        """Nodes the agent must not place work on: quarantined ones (irrecoverable or not)."""
        return {n for n, r in self.records().items() if r.state == NodeState.QUARANTINED}

    def record(self, node: str) -> NodeRecord:
        validate_node_name(node)
        return self.records().get(node, NodeRecord(node=node))

    def recent_auto_drains(self, now: float, window_s: float, events: Iterable[Event] | None = None) -> int:
        return sum(
            1
            for ev in (self.events() if events is None else events)
            if isinstance(ev, NodeDrained) and now - window_s <= ev.ts <= now
        )

    def append(self, node: str, evs: list[Event], wait_s: float = 30.0) -> None:
        """Append to this node's ledger; waits while an overlapping check of the same node holds it."""
        if not evs:
            return
        path = self.directory / f"node-{validate_node_name(node)}{SUFFIX}"
        try:
            check_format(path)
        except LedgerNotReadyError:
            pass
        except LedgerError as exc:
            if path.exists() or path.is_symlink():  # garbage, a foreign file, a FIFO or a directory
                self._set_aside(path, exc.message)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                writer = LedgerWriter(path, writer=f"health:{node}")
                break
            except LedgerError as exc:
                if "already has a writer" not in exc.message or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with writer:
            writer.extend(evs)
