"""Every rank's RNG state at its last step boundaries, kept where a replacement on the same node can
read it: the one part of a rank's state that no other rank holds a copy of.

In-place recovery takes the model, optimizer and the rest from a live replica, but a rank's random
streams (dropout masks, per-rank sampling) are its own. So at every step start a rank running under
:meth:`stalwart.train.Session.run` writes its Python, numpy and torch CPU RNG states into a small
file in the node's memory directory (tmpfs, owned by the agent's run; the run directory when there is
none). Two slots alternate by step parity, so the state at the start of the step the group resumes
at survives even if the rank died just after starting the next one. Each slot carries its step and a
CRC; a torn or foreign slot is ignored, never half-applied. Plain bytes: nothing is unpickled.

Cost: one ``pwrite`` of ~10 KB per step (measured in bench/bench_recovery.py's overhead line).
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from array import array
from pathlib import Path

import numpy as np
import torch

_MAGIC = b"SWRNG1\0\0"
_HEAD = "<8sqII"  # magic, step, payload length, crc32 of the payload
_HEAD_SIZE = struct.calcsize(_HEAD)
_PY_WORDS = 625  # Mersenne Twister: 624 words of state and the position
_NP_WORDS = 624
_SLOT = 16384  # bytes per slot: header plus payload (torch CPU state is 5056 bytes)


def path_for(directory: Path, node: str, rank: int) -> Path:
    return directory / f"live-rng-{node}-rank{rank}.bin"


def encode() -> bytes:
    """This process's RNG states as bytes (Python, numpy legacy, torch CPU)."""
    version, internal, gauss = random.getstate()
    py = array("I", internal).tobytes()
    name, keys, pos, has_gauss, np_gauss = np.random.get_state(legacy=True)
    if name != "MT19937":
        raise ValueError(f"numpy RNG {name} is not the legacy MT19937")
    npb = np.asarray(keys, dtype=np.uint32).tobytes()
    tb = torch.get_rng_state().numpy().tobytes()
    head = struct.pack(
        "<iid?iid?I",
        version,
        len(internal),
        float(gauss) if gauss is not None else 0.0,
        gauss is not None,
        int(pos),
        int(has_gauss),
        float(np_gauss),
        True,
        len(tb),
    )
    return head + py + npb + tb


def decode(data: bytes) -> None:
    """Restore the RNG states ``encode`` captured (raises ValueError on a malformed payload)."""
    fmt = "<iid?iid?I"
    n = struct.calcsize(fmt)
    version, words, gauss, has_py_gauss, pos, has_gauss, np_gauss, _, tlen = struct.unpack_from(fmt, data)
    if words != _PY_WORDS or len(data) != n + 4 * words + 4 * _NP_WORDS + tlen:
        raise ValueError("RNG record has an unexpected size")
    off = n
    internal = tuple(array("I", data[off : off + 4 * words]))
    off += 4 * words
    keys = np.frombuffer(data[off : off + 4 * _NP_WORDS], dtype=np.uint32).copy()
    off += 4 * _NP_WORDS
    tstate = torch.frombuffer(bytearray(data[off : off + tlen]), dtype=torch.uint8).clone()
    random.setstate((version, internal, gauss if has_py_gauss else None))
    np.random.set_state(("MT19937", keys, pos, has_gauss, np_gauss))
    torch.set_rng_state(tstate)


class LiveRng:
    """Writes this rank's RNG state at each step start; reads a rank's state back at a step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1

    def write(self, step: int) -> None:
        """Record the RNG state at the start of ``step`` (best effort: a full tmpfs only loses exactness
        of a later in-place replacement, never the step)."""
        payload = encode()
        if _HEAD_SIZE + len(payload) > _SLOT:
            return
        try:
            if self._fd < 0:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            head = struct.pack(_HEAD, _MAGIC, step, len(payload), zlib.crc32(payload))
            os.pwrite(self._fd, head + payload, (step % 2) * _SLOT)
        except OSError:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def restore_at(path: Path, step: int) -> str:
    """Restore the RNG state a rank recorded at the start of ``step``; "" on success, else why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return f"no RNG record for the replaced rank ({exc.strerror})"
    try:
        raw = os.pread(fd, _SLOT, (step % 2) * _SLOT)
    finally:
        os.close(fd)
    if len(raw) < _HEAD_SIZE:
        return f"no RNG record of step {step}"
    magic, at, length, crc = struct.unpack_from(_HEAD, raw)
    payload = raw[_HEAD_SIZE : _HEAD_SIZE + length]
    if magic != _MAGIC or at != step or len(payload) != length or zlib.crc32(payload) != crc:
        return f"the replaced rank's RNG record is of step {at}, not {step}"
    try:
        decode(payload)
    except (ValueError, struct.error) as exc:
        return f"the replaced rank's RNG record is malformed ({exc})"
    return ""
