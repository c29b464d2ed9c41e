"""The rank's hook ledger: what the bootstrap's step hooks record (a fault they fired, where the
unchanged script resumed), in a file of its own so a Session in the same process keeps its writer.
The file is opened at the first event: a run whose hooks record nothing has none."""

from __future__ import annotations

from pathlib import Path

from ...events import Event
from ...ledger import LedgerWriter


class HookLedger:
    def __init__(self, path: Path, rank: int) -> None:
        self.path = path
        self.rank = rank
        self._writer: LedgerWriter | None = None

    def append(self, ev: Event) -> None:
        if self._writer is None:
            self._writer = LedgerWriter(self.path, writer=f"rank {self.rank} (step hooks)")
        self._writer.append(ev)
