"""Node records kept in ledger files (one writer file per node under a state directory)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from pathlib import Path

from ..errors import LedgerError
from ..events import Event
from ..ledger import SUFFIX, LedgerWriter, read_merged
from .events import NodeDrained, NodeStateChanged
from .lifecycle import NodeRecord, NodeState

DEFAULT_STATE_DIR = Path("stalwart-runs/health")


def local_node_name() -> str:
    import os

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


class HealthStore:
    def __init__(self, directory: str | Path = DEFAULT_STATE_DIR) -> None:
        self.directory = Path(directory)

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}")) if self.directory.is_dir() else []

    def events(self) -> list[Event]:
        files = self._files()
        return read_merged(files) if files else []

    def records(self, events: Iterable[Event] | None = None) -> dict[str, NodeRecord]:
        out: dict[str, NodeRecord] = {}
        for ev in self.events() if events is None else events:
            if isinstance(ev, NodeStateChanged):
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

    def excluded(self) -> set[str]:
        """Nodes the agent must not place work on: quarantined ones (irrecoverable or not)."""
        return {n for n, r in self.records().items() if r.state == NodeState.QUARANTINED}

    def record(self, node: str) -> NodeRecord:
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
        path = self.directory / f"node-{node}{SUFFIX}"
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
