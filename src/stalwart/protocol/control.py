"""Agent <-> worker shared memory: a stop request and one heartbeat slot per local worker.

Layout of the memory-mapped file:

* header, 24 bytes: int64 ``stop_after`` (-1 = none: stop and save an emergency checkpoint once
  this many steps are done), int64 ``generation`` (bumped on every write of ``stop_after``), int64
  ``reform`` (the process-group generation the agent asks every worker to re-form into; 0 = none;
  -1 = none is coming: a worker waiting for one gives up);
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

_HEAD = "<qqq"
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
        fh.write(struct.pack(_HEAD, -1, 0, 0) + bytes(SLOT_SIZE * slots))


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
        return struct.unpack_from(_HEAD, self._mm, 0)[0]

    def request_stop(self, after_steps: int) -> None:
        _, gen, reform = struct.unpack_from(_HEAD, self._mm, 0)
        struct.pack_into(_HEAD, self._mm, 0, after_steps, gen + 1, reform)
        self._mm.flush()

    def reform(self) -> int:
        """The process-group generation the agent asked the workers to re-form into (0: none;
        ``REFUSED``: none is coming)."""
        return struct.unpack_from(_HEAD, self._mm, 0)[2]

    def request_reform(self, generation: int) -> None:
        """Agent side: ask every worker to leave its process group and join ``generation``."""
        stop, gen, _ = struct.unpack_from(_HEAD, self._mm, 0)
        struct.pack_into(_HEAD, self._mm, 0, stop, gen, generation)
        self._mm.flush()

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
