"""Agent <-> worker shared memory: a stop request and one heartbeat slot per local worker.

Layout of the memory-mapped file:

* header, 40 bytes: int64 ``stop_after`` (-1 = none: stop and save an emergency checkpoint once
  this many steps are done), int64 ``generation`` (bumped on every write of ``stop_after``), int64
  ``reform`` (the process-group generation the agent asks every worker to re-form into; 0 = none;
  -1 = none is coming: a worker waiting for one gives up), int64 ``first_rank`` and int64
  ``world_size`` (the node's place in the group ``reform`` names when it shrank: its first global
  rank and the new world size; -1 and 0 = the place is unchanged);
* one 32-byte slot per local worker: float64 wall time, int64 step, 16 bytes of section name.

A worker writes its slot at every step start and section start (a memory store, no system call)
and reads the header at every step end; the agent reads every slot each monitor tick. A slot can
be read while it is being written, so the agent reads it twice and keeps only a stable value.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

_HEAD = "<qqqqq"
_SLOT = "<dq16s"
HEAD_SIZE = struct.calcsize(_HEAD)
REFUSED = -1  # the ``reform`` value that tells a waiting worker no re-formation is coming
SLOT_SIZE = struct.calcsize(_SLOT)
SIZE = HEAD_SIZE  # kept for readers of the header only


def create(path: Path, slots: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # the run's private files are 0600 (docs/security.md)
    with open(fd, "wb") as fh:
        fh.write(struct.pack(_HEAD, -1, 0, 0, -1, 0) + bytes(SLOT_SIZE * slots))


class ControlBlock:
    def __init__(
        self, path: str | os.PathLike[str], *, writable: bool = False, slot: int | None = None
    ) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size
        self.slots = max(0, (size - HEAD_SIZE) // SLOT_SIZE)
        if slot is not None and not 0 <= slot < self.slots:
            slot = None  # an older or smaller block: no heartbeat slot for this worker
        self.slot = slot
        write = writable or slot is not None
        self._fh = open(self.path, "r+b" if write else "rb")  # noqa: SIM115 - closed in close()
        self._mm = mmap.mmap(self._fh.fileno(), size, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)
        self._offset = HEAD_SIZE + SLOT_SIZE * slot if slot is not None else -1

    def stop_after(self) -> int:
        return int(struct.unpack_from(_HEAD, self._mm, 0)[0])

    def request_stop(self, after_steps: int) -> None:
        _, gen, *rest = struct.unpack_from(_HEAD, self._mm, 0)
        struct.pack_into(_HEAD, self._mm, 0, after_steps, gen + 1, *rest)
        self._mm.flush()

    def reform(self) -> int:
        """The process-group generation the agent asked the workers to re-form into (0: none;
        ``REFUSED``: none is coming)."""
        return int(struct.unpack_from(_HEAD, self._mm, 0)[2])

    def request_reform(self, generation: int, place: tuple[int, int] | None = None) -> None:
        """Agent side: ask every worker to leave its process group and join ``generation``; with
        ``place`` (first global rank of this node, world size), in a group that shrank. The place is
        written before the generation, so a worker that sees the generation reads its place too."""
        stop, gen, _, first, world = struct.unpack_from(_HEAD, self._mm, 0)
        if place is not None:
            first, world = place
            if first < 0 or world < 1 or first >= world:
                raise ValueError(f"first rank {first} does not fit a world of {world}")
            struct.pack_into("<qq", self._mm, HEAD_SIZE - 16, first, world)
        struct.pack_into("<q", self._mm, 16, generation)
        self._mm.flush()

    def place(self) -> tuple[int, int] | None:
        """Worker side: (first global rank of this node, world size) of the shrunk group the agent
        asked for, or None when the node's place is unchanged."""
        first, world = struct.unpack_from("<qq", self._mm, HEAD_SIZE - 16)
        return (first, world) if first >= 0 and world > 0 else None

    def refuse_reform(self) -> None:
        """Agent side: no re-formation is coming; a worker waiting for one gives up at once."""
        self.request_reform(REFUSED)

    def beat(self, t: float, step: int, section: str = "") -> None:
        """Worker side: record progress in this worker's slot (no system call)."""
        if self._offset >= 0:
            struct.pack_into(_SLOT, self._mm, self._offset, t, step, section.encode()[:16])

    def read_beat(self, slot: int) -> tuple[float, int, str] | None:
        """Agent side: the slot's (time, step, section), or None if never written or being written."""
        off = HEAD_SIZE + SLOT_SIZE * slot
        first = struct.unpack_from(_SLOT, self._mm, off)
        if first != struct.unpack_from(_SLOT, self._mm, off) or first[0] == 0.0:
            return None
        return first[0], first[1], first[2].rstrip(b"\0").decode(errors="replace")

    def close(self) -> None:
        self._mm.close()
        self._fh.close()
