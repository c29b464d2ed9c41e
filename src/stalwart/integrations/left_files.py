"""The files (or directories) a framework callback's surviving ranks leave in node memory on a peer's
failure, named ``<prefix><node>-rank<R>-step<S>-a<attempt><suffix>``: which one the restarted group
resumes from, and their removal (integrations/lightning_left.py, integrations/hf_left.py).

Only the attempt right after the one that wrote a state takes it: every rank of an attempt has the
same attempt number, so they agree without talking (the framework forms the group only later), and an
attempt that took a state and failed anyway (before its first step removed the files) is followed by
one that resumes from the checkpoint instead of failing the same way again."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ..train.inplace import is_comm_failure
from ..train.live_rng import LiveRng, path_for
from ..train.update_watch import UpdateWatch

if TYPE_CHECKING:
    from .link import StepLink


@dataclass(frozen=True)
class Left:
    """The left state the restarted group resumes from: its path, the step, the rank that left it."""

    path: Path
    step: int
    source: int
    attempt: int  # the agent's attempt whose rank wrote it


@dataclass(frozen=True)
class Names:
    """How one framework's left states are named."""

    prefix: str
    suffix: str = ""

    def path(self, directory: Path, node: str, rank: int, step: int, attempt: int) -> Path:
        return directory / f"{self.prefix}{node}-rank{rank}-step{step:08d}-a{attempt}{self.suffix}"

    def _pattern(self, node: str = "", rank: int = -1) -> re.Pattern[str]:
        n = re.escape(node) if node else ".+"
        r = str(rank) if rank >= 0 else r"\d+"
        return re.compile(
            rf"^{re.escape(self.prefix)}(?P<node>{n})-rank(?P<rank>{r})-step(?P<step>\d+)-a(?P<attempt>\d+){re.escape(self.suffix)}$"
        )

    def found(self, directory: Path, node: str) -> list[Left]:
        """Every state this node's ranks left (names of other nodes or malformed are skipped)."""
        pattern = self._pattern(node)
        out = []
        for p in directory.glob(f"{self.prefix}*") if directory.is_dir() else ():
            m = pattern.match(p.name)
            if m is not None:
                out.append(Left(p, int(m["step"]), int(m["rank"]), int(m["attempt"])))
        return out

    def choose(self, directory: Path, node: str, rank: int, attempt: int) -> Left | None:
        """What every rank of this node's ``attempt`` resumes from: of the states the attempt before
        wrote, the lowest step (every rank must resume at the same one), this rank's own at that step
        when there is one, else the lowest rank's."""
        found = [f for f in self.found(directory, node) if f.attempt == attempt - 1]
        if not found:
            return None
        step = min(f.step for f in found)
        return sorted((f for f in found if f.step == step), key=lambda f: (f.source != rank, f.source))[0]

    def forget(self, directory: Path, node: str, rank: int, every: bool) -> None:
        """Remove this rank's own left states, or (``every``: local rank 0, once every rank loaded
        its own) all of this node's."""
        mine = self._pattern(node, rank)
        for left in self.found(directory, node):
            if every or mine.match(left.path.name):
                if left.path.is_dir():
                    shutil.rmtree(left.path, ignore_errors=True)
                else:
                    left.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Place:
    """Where this rank leaves its state: the node's memory directory, the node, its ranks, the attempt."""

    directory: Path
    node: str
    rank: int
    local_rank: int
    attempt: int


def place(link: StepLink) -> Place | None:
    """This rank's place, or None where a framework's live state is not left: without an agent or its
    node memory directory, with ``--no-leave-state``, alone, or across nodes (the ranks of a node that
    died with all its ranks would find nothing, and the nodes could not agree on a step before the
    framework forms the group)."""
    s = link.session
    w = s.worker_env
    if w is None or not w.mem_dir or not w.leave_state or not s.under_agent:
        return None
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if world < 2 or world != local:
        return None
    return Place(Path(w.mem_dir), s.node, s.rank, s.local_rank, s.attempt)


class RankLeft:
    """What every framework's side of one rank shares (integrations/lightning_left.py,
    integrations/hf_left.py): its place, its RNG record, whether an optimizer stepped since the last
    recorded boundary (a global optimizer step hook), the state the restart picked, and the removal."""

    names: ClassVar[Names]

    def __init__(self, directory: Path, node: str, rank: int, local_rank: int, attempt: int) -> None:
        self.directory, self.node, self.rank, self.local_rank = directory, node, rank, local_rank
        self.attempt = attempt  # the agent's attempt this process runs in
        self.rng = LiveRng(path_for(directory, node, rank))
        self.updates = UpdateWatch()  # whether an optimizer stepped since the boundary was recorded
        self.resumed: Left | None = None  # the state the restart resumes from

    def why_not(self, exc: BaseException, recorded: bool) -> str | None:
        """Before leaving on ``exc``: None when the state is to be left, "" when it is not wanted (not
        a peer's failure), else why it cannot be (``recorded``: a boundary was recorded)."""
        if not is_comm_failure(exc):
            return ""
        if not recorded:
            return f"rank {self.rank} failed before its first completed step: nothing to leave"
        if self.updates.landed():
            return f"rank {self.rank}'s optimizer had stepped in the interrupted step: its state is past the step"
        return None

    def resume(self, newest_checkpoint: int) -> Left | None:
        """The state this attempt resumes from when it is newer than the newest checkpoint (its step):
        :meth:`Names.choose`, kept only when it was written whole."""
        got = self.names.choose(self.directory, self.node, self.rank, self.attempt)
        self.resumed = got if got is not None and self._whole(got) and got.step > newest_checkpoint else None
        return self.resumed

    def _whole(self, left: Left) -> bool:
        """Whether a chosen state was written whole (a framework may check a file written last)."""
        return True

    def forget(self) -> None:
        """Remove the states this node's ranks left (local rank 0, once every rank loaded its own; the
        others their own): a later restart must never resume from an older state than a newer
        checkpoint."""
        self.names.forget(self.directory, self.node, self.rank, every=self.local_rank == 0)

    def close(self) -> None:
        self.updates.close()
        self.rng.close()


__all__ = ["Left", "Names", "Place", "RankLeft", "place"]
