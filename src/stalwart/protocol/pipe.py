"""Worker -> agent messages over one pipe per worker, never blocking the worker.

Each message is one line (see :mod:`stalwart.protocol` for the records and their encoding),
shorter than PIPE_BUF, so a write is atomic. The worker's end is non-blocking: if the agent falls
behind and the pipe (64 KiB) is full, the message is dropped and counted instead of stalling the
training step. The agent drains every pipe from its monitor loop. (Unix datagram sockets were
tried first: their receive queue holds only ``net.unix.max_dgram_qlen`` datagrams, which dropped
heartbeats under load.)
"""

from __future__ import annotations

import fcntl
import os

from . import Message, decode, encode


class Sender:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.dropped = 0

    def send(self, msg: Message) -> None:
        try:
            os.write(self.fd, encode(msg))
        except (BlockingIOError, BrokenPipeError, OSError):
            self.dropped += 1

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class Receiver:
    """The agent's read ends, one per worker."""

    def __init__(self) -> None:
        self._fds: dict[int, bytearray] = {}

    def new_channel(self) -> int:
        """Create a pipe; return the write end for the worker (the read end stays here)."""
        r, w = os.pipe()
        flags = fcntl.fcntl(r, fcntl.F_GETFL)
        fcntl.fcntl(r, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._fds[r] = bytearray()
        return w

    def drain(self) -> list[Message]:
        out = []
        for fd, buf in self._fds.items():
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                buf += chunk
            *lines, rest = buf.split(b"\n")
            buf[:] = rest
            for line in lines:
                msg = decode(bytes(line))
                if msg is not None:  # a garbled line is dropped, never fatal
                    out.append(msg)
        return out

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
