"""Stage phase: copy training state into reusable host buffers with the least possible stall.

The buffers are allocated once per tensor (keyed by its path in the state and its shape/dtype)
and reused by every later save, so a steady-state save allocates nothing. They are pinned when
CUDA is available (device-to-host copies run at PCIe/NVLink-C2C speed and are issued
``non_blocking`` with one synchronize at the end) and in shared memory (/dev/shm) otherwise.

A :class:`Snapshot` is a consistent copy: once :meth:`Stager.stage` returns, the training loop
may change its tensors in place; the snapshot keeps the values from before. DTensors are staged
as their local shard and rebuilt as DTensors over the staged buffer (no collective), so
torch.distributed.checkpoint still sees the global sharding and can reshard on load.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

try:  # DTensor is optional (older torch, or distributed not built)
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = None  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class Snapshot:
    """A staged, consistent copy of one step's state (backed by the stager's buffers)."""

    step: int
    state: dict[str, Any]  # Any: torch state_dict values (tensors, nested containers, user objects)
    rank_state: Any  # Any: a per-rank object of the user's, anything torch.save pickles
    bytes: int
    stall_s: float
    generation: int


class Stager:
    """Owns the reusable host buffers and copies state into them."""

    def __init__(
        self,
        *,
        pin: bool | None = None,
        shared: bool | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        cuda = torch.cuda.is_available()
        self.pin = cuda if pin is None else pin
        self.shared = (not self.pin) if shared is None else shared
        self._clock = clock
        self._buffers: dict[str, torch.Tensor] = {}
        self._generation = 0
        self.allocated_bytes = 0

    def _buffer_for(self, key: str, src: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is not None and buf.shape == src.shape and buf.dtype == src.dtype:
            return buf
        if buf is not None:
            self.allocated_bytes -= buf.numel() * buf.element_size()
        buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=self.pin)
        if self.shared and not self.pin:
            buf.share_memory_()
        buf.zero_()  # touch every page now, not during the first stall
        self._buffers[key] = buf
        self.allocated_bytes += buf.numel() * buf.element_size()
        return buf

    # Any: torch state_dict values (tensors, nested containers, user objects)
    def _copy(self, key: str, value: Any, counter: list[int]) -> Any:
        if DTensor is not None and isinstance(value, DTensor):
            local = value.to_local()
            buf = self._buffer_for(key, local)
            buf.copy_(local.detach(), non_blocking=True)
            counter[0] += buf.numel() * buf.element_size()
            return DTensor.from_local(
                buf,
                value.device_mesh,
                value.placements,
                run_check=False,
                shape=value.shape,
                stride=value.stride(),
            )
        if isinstance(value, torch.Tensor):
            src = value.detach()
            if not src.is_contiguous():
                src = src.contiguous()
            buf = self._buffer_for(key, src)
            buf.copy_(src, non_blocking=True)
            counter[0] += buf.numel() * buf.element_size()
            return buf
        if isinstance(value, dict):
            items = ((k, self._copy(f"{key}/{k}", v, counter)) for k, v in value.items())
            if not isinstance(value, OrderedDict):
                return dict(items)
            out = OrderedDict(items)  # module state_dicts: keep the type and the version metadata
            if hasattr(value, "_metadata"):
                out._metadata = copy.deepcopy(value._metadata)  # type: ignore[attr-defined]
            return out
        if isinstance(value, list):
            return [self._copy(f"{key}/{i}", v, counter) for i, v in enumerate(value)]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self._copy(f"{key}/{i}", v, counter) for i, v in enumerate(value))
        return copy.deepcopy(value)

    # Any: torch state_dict values and the user's per-rank object (anything torch.save pickles)
    def stage(self, step: int, state: dict[str, Any], rank_state: Any = None) -> Snapshot:
        """Copy ``state`` (and this rank's ``rank_state``) into the host buffers; blocks until done."""
        t0 = self._clock()
        counter = [0]
        staged = self._copy("s", state, counter)
        staged_rank = self._copy("r", rank_state, counter) if rank_state is not None else None
        if self.pin and torch.cuda.is_available():
            torch.cuda.synchronize()
        stall = self._clock() - t0
        self._generation += 1
        return Snapshot(
            step=step,
            state=staged,
            rank_state=staged_rank,
            bytes=counter[0],
            stall_s=stall,
            generation=self._generation,
        )
