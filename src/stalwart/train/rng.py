"""Capture and restore every RNG a training process uses, for exact resume.

The captured state is plain data (ints, tuples, tensors), so a checkpoint stores it without
pickling objects and reads it back with ``torch.load(weights_only=True)``: numpy's key array is
kept as an int64 tensor and turned back into an array on restore.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state["numpy"] = (
        str(name),
        torch.from_numpy(np.asarray(keys).astype(np.int64)),
        int(pos),
        int(has_gauss),
        float(gauss),
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
