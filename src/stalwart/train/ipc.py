"""Worker -> agent messages over one pipe per worker, never blocking the worker.

Each message is one line of JSON, shorter than PIPE_BUF, so a write is atomic. The worker's end
is non-blocking: if the agent falls behind and the pipe (64 KiB) is full, the message is dropped
and counted instead of stalling the training step. The agent drains every pipe from its monitor
loop. (Unix datagram sockets were tried first: their receive queue holds only
``net.unix.max_dgram_qlen`` datagrams, which dropped heartbeats under load.)
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import Any

_MAX = 4000  # < PIPE_BUF (4096): atomic writes


class Sender:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self.dropped = 0

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        if len(data) > _MAX:
            msg = {k: v for k, v in msg.items() if k != "sec"}
            data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            os.write(self.fd, data)
        except (BlockingIOError, BrokenPipeError, OSError):
            self.dropped += 1

    def send_done(self, rank: int, step: int, t0: float, duration: float, sections: dict[str, float]) -> None:
        """The per-step record as one compact text line: ``D rank step t0 duration name=secs ...``.

        JSON's encoder calls back into Python for every float (about 40 us per record here); this is
        a few microseconds. Section names must not contain spaces or '='."""
        parts = [f"D {rank} {step} {t0:.6f} {duration:.6f}"]
        for name, secs in sections.items():
            parts.append(f"{name}={secs:.6f}")
        data = (" ".join(parts) + "\n").encode()
        try:
            os.write(self.fd, data[:_MAX] if len(data) <= _MAX else (parts[0] + "\n").encode())
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

    def drain(self) -> list[dict[str, Any]]:
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
                try:
                    out.append(_parse_done(line) if line.startswith(b"D ") else json.loads(line))
                except (ValueError, IndexError):
                    continue  # a garbled line is dropped, never fatal
        return out

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _parse_done(line: bytes) -> dict[str, Any]:
    fields = line.decode().split()
    t0, d = float(fields[3]), float(fields[4])
    sections = {}
    for item in fields[5:]:
        name, _, secs = item.partition("=")
        sections[name] = float(secs)
    return {
        "k": "done",
        "r": int(fields[1]),
        "s": int(fields[2]),
        "t": t0 + d,
        "t0": t0,
        "d": d,
        "sec": sections,
    }
