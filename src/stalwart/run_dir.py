"""Layout of a run directory: where ledgers, checkpoints, stacks and chaos state live."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def ledger(self) -> Path:
        return self.root / "ledger"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def chaos(self) -> Path:
        return self.root / "chaos"

    @property
    def errors(self) -> Path:
        return self.root / "errors"

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    def agent_ledger(self, node: str) -> Path:
        return self.ledger / f"agent-{node}.ledger"

    def rank_ledger(self, rank: int) -> Path:
        return self.ledger / f"rank-{rank}.ledger"

    def create(self) -> RunDir:
        # private: ledgers hold stacks, command lines and host names (existing directories keep their mode)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for p in (self.ledger, self.checkpoints, self.chaos, self.errors, self.stacks):
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self
