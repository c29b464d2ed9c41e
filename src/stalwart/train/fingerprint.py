"""Parameter fingerprints: which state a model holds, told cheaply through public tensor APIs.

Two kinds. :func:`exact` tells replicas apart (silent data corruption, ``replica_check.py``): per
tensor, the sum of its elements' bit patterns as integers. A single flipped bit moves that sum by a
power of two, so it always changes it; the sum ignores order, reads memory once and needs nothing but
a reduction. :func:`sampled`, below, is a cheap hash of a few elements, for telling steps apart.

A sampled fingerprint hashes a few elements of a few of the optimizer's parameters: an optimizer
step moves nearly every element of a dense weight, so two steps' states differ in it, while a state
saved with ``torch.save`` and loaded back is the same bits, so it matches. That is enough to tell
which step's state a restarted script began from (``step_history.py``) without reading the script's
checkpoint or patching anything.

The tensors are chosen once, spread over the parameter list (its first, its last and evenly between:
the output layer, which every step updates densely, is usually last), and each gives elements at an
even stride. A sharded parameter (a DTensor) contributes its local shard only: reading the whole
would be a collective, and a hook must never start one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

TENSORS = 6  # parameters sampled
ELEMENTS = 8  # elements sampled from each

# The integer type of each floating type's width: a tensor's bits, read as integers of its own size.
_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def pick(params: Sequence[torch.Tensor], tensors: int = TENSORS) -> list[torch.Tensor]:
    """Up to ``tensors`` of ``params`` spread over the list (first and last included)."""
    live = [p for p in params if p.numel() > 0]
    if len(live) <= tensors:
        return live
    step = (len(live) - 1) / (tensors - 1)
    return [live[round(i * step)] for i in range(tensors)]


def _local(p: torch.Tensor) -> torch.Tensor:
    to_local = getattr(p, "to_local", None)  # a DTensor: its shard, with no collective
    return to_local() if callable(to_local) else p


def sampled(params: Sequence[torch.Tensor], elements: int = ELEMENTS) -> str:
    """A 16-hex-digit fingerprint of ``elements`` evenly strided elements of each of ``params``
    (their values as float64, so every floating dtype hashes exactly); "" for no elements."""
    picks = []
    with torch.no_grad():
        for p in params:
            flat = _local(p).detach().reshape(-1)
            if flat.numel() == 0:
                continue
            stride = max(1, flat.numel() // elements)
            picks.append(flat[::stride][:elements].to(torch.float64))
        if not picks:
            return ""
        values = torch.cat(picks).cpu()
    return hashlib.blake2b(values.numpy().tobytes(), digest_size=8).hexdigest()


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns as integers of the same width (a view, no copy, for floating types);
    integer and boolean tensors as they are; anything else (complex) as its bytes."""
    ints = _BITS.get(t.dtype)
    if ints is not None:
        return t.view(ints)
    if t.dtype.is_complex:
        return t.contiguous().view(torch.uint8)
    return t


def exact(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """An int64 vector, one element per tensor: the sum of its bit patterns (wrapping for 64-bit
    types). Every single-bit flip in a tensor changes its element. A sharded tensor (a DTensor)
    contributes its local shard only. On the tensors' device, with no copy to the host."""
    with torch.no_grad():
        sums = [bits(_local(t).detach()).sum(dtype=torch.int64) for t in tensors]
    if not sums:
        return torch.zeros(0, dtype=torch.int64)
    return torch.stack(sums)
