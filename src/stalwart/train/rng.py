"""Capture and restore every RNG a training process uses, for exact resume.

The captured state is plain data (ints, tuples, tensors), so a checkpoint stores it without
pickling objects and reads it back with ``torch.load(weights_only=True)``: numpy's key array is
kept as an int64 tensor and turned back into an array on restore. ``to_json``/``from_json`` carry
it between ranks as JSON (tensors as base64 bytes), so a gather of every rank's state unpickles nothing.
"""

from __future__ import annotations

import base64
import binascii
import random
from typing import Any

import numpy as np
import torch

from ..protocol.json_collective import JSON


def capture() -> dict[str, Any]:  # Any: random/numpy/torch RNG states, each its own type
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


def restore(state: dict[str, Any]) -> None:  # Any: random/numpy/torch RNG states, each its own type
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.contiguous().view(torch.uint8).numpy().tobytes()).decode("ascii")


def _bytes_tensor(text: object) -> torch.Tensor:
    if not isinstance(text, str):
        raise ValueError("an RNG byte state is not a base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"an RNG byte state is not base64: {exc}") from None
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()
        if data
        else torch.empty(0, dtype=torch.uint8)
    )


def _ints(value: object, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"the {what} RNG words are not a list of integers")
    return value


def _number(value: object, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"the {what} RNG value is not a number")
    return float(value)


def to_json(state: dict[str, Any]) -> JSON:  # Any: random/numpy/torch RNG states, each its own type
    """A :func:`capture`'d state as JSON (what a gather of every rank's state sends)."""
    version, internal, gauss = state["python"]
    out: dict[str, JSON] = {
        "python": [int(version), [int(w) for w in internal], gauss],
        "torch": _b64(state["torch"]),
    }
    if "numpy" in state:
        name, keys, pos, has_gauss, np_gauss = state["numpy"]
        out["numpy"] = [str(name), [int(k) for k in keys.tolist()], int(pos), int(has_gauss), float(np_gauss)]
    if "cuda" in state:
        out["cuda"] = [_b64(t) for t in state["cuda"]]
    return out


def from_json(value: JSON) -> dict[str, Any]:  # Any: random/numpy/torch RNG states, each its own type
    """The state :func:`to_json` wrote, as :func:`capture` returns it; ValueError when it is not one."""
    py = value.get("python") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not isinstance(py, list) or len(py) != 3:
        raise ValueError("not an RNG state")
    version, internal, gauss = py
    if not isinstance(version, int) or not (gauss is None or isinstance(gauss, float)):
        raise ValueError("the Python RNG state is malformed")
    # Any: random, torch and numpy each take their own state type back
    state: dict[str, Any] = {
        "python": (version, tuple(_ints(internal, "Python")), gauss),
        "torch": _bytes_tensor(value.get("torch")),
    }
    if "numpy" in value:
        np_state = value["numpy"]
        if not isinstance(np_state, list) or len(np_state) != 5 or not isinstance(np_state[0], str):
            raise ValueError("the numpy RNG state is malformed")
        name, keys, pos, has_gauss, np_gauss = np_state
        state["numpy"] = (
            name,
            torch.tensor(_ints(keys, "numpy"), dtype=torch.int64),
            int(_number(pos, "numpy position")),
            int(_number(has_gauss, "numpy has_gauss")),
            _number(np_gauss, "numpy gauss"),
        )
    if "cuda" in value:
        cuda = value["cuda"]
        if not isinstance(cuda, list):
            raise ValueError("the CUDA RNG states are not a list")
        state["cuda"] = [_bytes_tensor(t) for t in cuda]
    return state
