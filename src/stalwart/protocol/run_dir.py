"""Layout of a run directory: every path the agent and the workers share (ledgers, checkpoints,
error files, stack dumps, logs, control blocks, chaos state)."""

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

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def identity(self) -> Path:
        """What the run is (its command line): a re-run with another script must not reuse it."""
        return self.root / "run.json"

    def agent_ledger(self, node: str, pid: int) -> Path:
        return self.ledger / f"agent-{node}-{pid}.ledger"

    def worker_ledger(self, node: str, attempt: int, rank: int, pid: int) -> Path:
        return self.ledger / f"worker-{node}-a{attempt}-r{rank}-p{pid}.ledger"

    def rank_ledger(self, rank: int) -> Path:
        return self.ledger / f"rank-{rank}.ledger"

    def error_file(self, node: str, attempt: int, rank: int) -> Path:
        """The SDK's record of an uncaught exception."""
        return self.errors / f"{node}-a{attempt}-r{rank}.json"

    def archive_errors(self, node: str, job: str) -> list[Path]:
        """Move ``node``'s error records of earlier jobs aside (attempt numbers restart with every
        job, so a requeue would otherwise read the previous job's exception as its own)."""
        moved = []
        old = sorted(self.errors.glob(f"{node}-a*-r*.json")) if self.errors.is_dir() else []
        if old:
            dest = self.errors / f"earlier-{job}"
            dest.mkdir(parents=True, exist_ok=True, mode=0o700)
            for f in old:
                f.replace(dest / f.name)
                moved.append(dest / f.name)
        return moved

    def elastic_error_file(self, node: str, attempt: int, rank: int) -> Path:
        """TORCHELASTIC_ERROR_FILE: where torch elastic's ``@record`` writes its error record."""
        return self.errors / f"{node}-a{attempt}-r{rank}.elastic.json"

    def stack_file(self, node: str, attempt: int, rank: int) -> Path:
        return self.stacks / f"{node}-a{attempt}-r{rank}.txt"

    def log_file(self, node: str, attempt: int, rank: int) -> Path:
        """Everything the worker printed (stdout and stderr), whatever the console shows."""
        return self.logs / f"{node}-a{attempt}-r{rank}.log"

    def control_file(self, node: str, pid: int, attempt: int) -> Path:
        return self.control / f"{node}-{pid}-a{attempt}.bin"

    def create(self) -> RunDir:
        # private: ledgers hold stacks, command lines and host names (existing directories keep their mode)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        dirs = (self.ledger, self.checkpoints, self.chaos, self.errors, self.stacks, self.logs, self.control)
        for p in dirs:
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self


@dataclass(frozen=True)
class MemDir:
    """The agent's private node-memory directory (``WorkerEnv.mem_dir``, tmpfs): this node's memory
    tier and the copies its agent holds for the other nodes."""

    root: Path

    @property
    def own(self) -> Path:
        """This node's memory-tier versions."""
        return self.root / "ckpt"

    @property
    def held(self) -> Path:
        """Other nodes' files that this node's agent keeps (its peer store)."""
        return self.root / "held"
