"""Layout of a run directory: every path the agent and the workers share (ledgers, checkpoints,
error files, stack dumps, logs, control blocks, chaos state)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .private_paths import open_dir, open_root


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
    def steps(self) -> Path:
        """The unchanged scripts' step histories (``protocol/step_history.py``)."""
        return self.root / "steps"

    def step_history(self, rank: int) -> Path:
        return self.steps / f"r{rank}.txt"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def identity(self) -> Path:
        """What the run is (its command line): a re-run with another script must not reuse it."""
        return self.root / "run.json"

    def agent_ledger(self, node: str, pid: int) -> Path:
        return self.ledger / f"agent-{node}-{pid}.ledger"

    def scrub_ledger(self, node: str, pid: int) -> Path:
        """The ledger of the agent's background checkpoint verification (a writer of its own thread)."""
        return self.ledger / f"scrub-{node}-{pid}.ledger"

    def worker_ledger(self, node: str, attempt: int, rank: int, pid: int) -> Path:
        return self.ledger / f"worker-{node}-a{attempt}-r{rank}-p{pid}.ledger"

    def hook_ledger(self, node: str, attempt: int, rank: int, pid: int) -> Path:
        """The ledger of what the worker bootstrap's step hooks record (chaos fired in an unchanged
        script): a file of its own, so a Session in the same process keeps its own writer."""
        return self.ledger / f"hook-{node}-a{attempt}-r{rank}-p{pid}.ledger"

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
        """Create (or verify) the run directory and its subdirectories: private, since ledgers hold
        stacks, command lines and host names. The root is this user's and not a link (an existing
        one keeps its mode); each subdirectory is this user's, 0700, and never a link
        (:mod:`.private_paths`). A plant is refused with a :class:`PathRefused` naming it."""
        dirs = (
            self.ledger,
            self.checkpoints,
            self.chaos,
            self.errors,
            self.stacks,
            self.logs,
            self.steps,
            self.control,
        )
        try:
            root_fd = open_root(self.root)
        except OSError as exc:
            raise ConfigError(
                f"cannot create run directory {self.root}: {exc.strerror}", "give a writable --run-dir"
            ) from None
        try:
            for p in dirs:
                try:
                    os.close(open_dir(root_fd, p.name, p))
                except OSError as exc:
                    raise ConfigError(
                        f"cannot create {p}: {exc.strerror}", "give a writable --run-dir"
                    ) from None
        finally:
            os.close(root_fd)
        return self


# the names the SDK gives its tiers (train/checkpoints.py): they prefix every CheckpointRejected reason
# and name the tier in what the agent says about a version (chaos damage, background verification)
DISK_TIER = "local"  # the run directory's checkpoints/
MEMORY_TIER = "memory"  # the node memory tier (MemDir.own)


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
