"""Agent -> worker control block: a 16-byte memory-mapped file the worker reads at step ends.

Layout: int64 ``stop_after`` (-1 = none: stop and save an emergency checkpoint once this many
steps are done), int64 ``generation`` (bumped on every write). Reading it costs one memory load,
so the training loop checks it every step without a system call.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

_FMT = "<qq"
SIZE = struct.calcsize(_FMT)


def create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(struct.pack(_FMT, -1, 0))


class ControlBlock:
    def __init__(self, path: str | os.PathLike[str], *, writable: bool = False) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "r+b" if writable else "rb")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self._mm = mmap.mmap(self._fh.fileno(), SIZE, access=access)

    def stop_after(self) -> int:
        return struct.unpack_from(_FMT, self._mm, 0)[0]

    def request_stop(self, after_steps: int) -> None:
        gen = struct.unpack_from(_FMT, self._mm, 0)[1]
        struct.pack_into(_FMT, self._mm, 0, after_steps, gen + 1)
        self._mm.flush()

    def close(self) -> None:
        self._mm.close()
        self._fh.close()
