"""Turn the user's ``state`` dict into what the checkpoint engine saves on every rank, and back.

``state`` maps names to live objects: ``nn.Module``s (plain, DDP, FSDP2 ``fully_shard``, HSDP,
DTensor TP), optimizers, and anything else with ``state_dict``/``load_state_dict`` (LR scheduler,
a ``StatefulDataLoader``, a sampler) or a plain dict. It is split in two:

* **sharded**: the tensors of every model and optimizer, taken with
  ``torch.distributed.checkpoint.state_dict.get_state_dict`` on every rank (DTensor shards stay
  shards), saved through DCP, which reshards them when the world size changes;
* **extras** (per rank): everything else as plain data: the non-tensor leaves of the model and
  optimizer state dicts (param groups: lr, betas, ...), the other objects' state dicts, and the
  RNG states. The engine writes them with ``torch.save`` and reads them back with
  ``torch.load(weights_only=True)``; anything that is not plain data is refused at save time, so
  nothing from a checkpoint is ever unpickled into an object.

On load the targets are the live objects' own state dicts at the current world size, so a run
resumed on fewer or more ranks receives its model and optimizer resharded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CheckpointError
from . import rng

_PLAIN = (type(None), bool, int, float, str, bytes, torch.dtype, torch.device, torch.Size)
KeyPath = tuple[object, ...]  # dict keys and list positions


@dataclass(frozen=True)
class Captured:
    """One rank's state, ready for the engine: ``sharded`` (tensors only, DCP) and ``extras`` (plain)."""

    sharded: dict[str, torch.Tensor]
    extras: dict[str, Any]  # Any: plain data of any shape, read back by torch.load


def _leaves(obj: object, path: KeyPath = ()) -> Iterator[tuple[KeyPath, object]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif (
        isinstance(obj, (list, tuple))
        and not hasattr(obj, "_fields")
        and not isinstance(obj, torch.Size)
        and any(isinstance(v, (torch.Tensor, dict, list)) for v in obj)
    ):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    else:
        yield path, obj


def _key(path: KeyPath) -> str:
    return "/".join(str(p) for p in path)


def check_plain(obj: object, where: str) -> None:
    """Raise CheckpointError unless ``obj`` is tensors and plain containers of plain values."""
    if isinstance(obj, torch.Tensor) or isinstance(obj, _PLAIN):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, tuple, type(None))):
                raise CheckpointError(
                    f"checkpoint state {where} has a key of type {type(k).__name__}",
                    "use str or int keys in state dicts",
                )
            check_plain(v, f"{where}/{k}")
        return
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}/{i}")
        return
    raise CheckpointError(
        f"checkpoint state {where} is a {type(obj).__module__}.{type(obj).__qualname__}, "
        "which a checkpoint cannot hold without pickling it",
        "return only tensors, numbers, strings and lists/dicts of them from state_dict()",
    )


def _is_module(obj: object) -> bool:
    return isinstance(obj, torch.nn.Module)


def _is_optimizer(obj: object) -> bool:
    return isinstance(obj, torch.optim.Optimizer)


def _owner(opt: torch.optim.Optimizer, modules: dict[str, torch.nn.Module]) -> str:
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    for name, mod in modules.items():
        if any(id(p) in ids for p in mod.parameters()):
            return name
    raise CheckpointError(
        "an optimizer in the checkpoint state optimizes no module in the state",
        "put the model it trains into the same state dict",
    )


# Any: the user's state holds live objects of any kind; torch state dicts hold values of any type
def _live_dicts(state: dict[str, Any]) -> tuple[dict[str, Any], list[torch.optim.Optimizer]]:
    """The models' and optimizers' state dicts (sharded; every rank calls this). Also returns the
    optimizers that had no state yet: ``get_optimizer_state_dict`` initialises them with a zero-lr
    step (which counts as a step in Adam's ``step``), so callers clear them again when nothing loads."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )  # deferred: heavy (torch)

    modules = {k: v for k, v in state.items() if _is_module(v)}
    out: dict[str, Any] = {}  # Any: torch state dicts hold values of any type
    fresh = [v for v in state.values() if _is_optimizer(v) and not v.state]
    for key, obj in state.items():
        if _is_module(obj):
            out[key] = get_model_state_dict(obj)
        elif _is_optimizer(obj):
            out[key] = get_optimizer_state_dict(modules[_owner(obj, modules)], obj)
    return out, fresh


def forget_init(fresh: list[torch.optim.Optimizer]) -> None:
    """Undo the state initialisation of optimizers that had not stepped yet."""
    for opt in fresh:
        opt.state.clear()


# Any: the user's state holds live objects of any kind (modules, optimizers, samplers, dicts)
def capture(state: dict[str, Any]) -> Captured:
    """Collective over all ranks: this rank's sharded tensors and plain extras."""
    live, fresh = _live_dicts(state)
    forget_init(fresh)  # the captured dicts keep the tensors; the live optimizer stays as it was
    sharded: dict[str, torch.Tensor] = {}
    plain: list[tuple[list[object], object]] = []
    for path, leaf in _leaves(live):
        if isinstance(leaf, torch.Tensor):
            sharded[_key(path)] = leaf
        else:
            plain.append((list(path), leaf))
    objects: dict[str, object] = {}
    for key, obj in state.items():
        if key in live:
            continue
        objects[key] = obj.state_dict() if hasattr(obj, "state_dict") else obj
    extras = {"format": 1, "plain": plain, "objects": objects, "rng": rng.capture()}
    check_plain(extras, "extras")
    return Captured(sharded, extras)


@dataclass(frozen=True)
class Targets:
    """Where a checkpoint loads into: the live state dicts and their flat tensor view (DCP fills
    the tensors in place), plus the optimizers that were initialised only to build the view."""

    live: dict[str, Any]  # Any: torch state dicts hold values of any type
    tensors: dict[str, torch.Tensor]
    fresh: list[torch.optim.Optimizer]


# Any: the user's state holds live objects of any kind (modules, optimizers, samplers, dicts)
def load_targets(state: dict[str, Any]) -> Targets:
    """Collective: the live models' and optimizers' state dicts at this world size."""
    live, fresh = _live_dicts(state)
    return Targets(
        live, {_key(p): leaf for p, leaf in _leaves(live) if isinstance(leaf, torch.Tensor)}, fresh
    )


# Any: nested dicts and lists of a torch state dict, indexed by key or position
def _set(root: Any, path: list[object], value: object) -> None:
    node = root
    for p in path[:-1]:
        node = node[p]
    if isinstance(node, tuple):
        raise CheckpointError(
            f"checkpoint value at {_key(tuple(path))} sits inside a tuple",
            "this state layout is not supported",
        )
    node[path[-1]] = value


# Any: the user's state holds live objects of any kind; extras are torch.load output
def apply(state: dict[str, Any], targets: Targets, extras: dict[str, Any], *, own_rng: bool) -> None:
    """Put a loaded checkpoint into the live objects: ``targets`` from :func:`load_targets` after
    DCP filled its tensors in place, ``extras`` as read back from the rank file."""
    live = targets.live
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )  # deferred: heavy (torch)

    for path, value in extras.get("plain", []):
        if path[0] not in live:
            raise CheckpointError(
                f"checkpoint holds {path[0]!r}, which the state to load has no model or optimizer for",
                "load with the same state keys it was saved with",
            )
        try:
            _set(live, path, value)
        except (KeyError, IndexError, TypeError) as exc:
            raise CheckpointError(
                f"checkpoint value {_key(tuple(path))} does not fit the state to load ({exc})",
                "load with the same model and optimizer it was saved with",
            ) from exc
    modules = {k: v for k, v in state.items() if _is_module(v)}
    for key, obj in state.items():
        if _is_module(obj):
            set_model_state_dict(obj, live[key])
    for key, obj in state.items():
        if _is_optimizer(obj):
            set_optimizer_state_dict(modules[_owner(obj, modules)], obj, live[key])
    objects = extras.get("objects", {})
    for key, obj in state.items():
        if key in live or key not in objects:
            continue
        if hasattr(obj, "load_state_dict"):
            obj.load_state_dict(objects[key])
        elif isinstance(obj, dict):
            obj.clear()
            obj.update(objects[key])
    if own_rng and "rng" in extras:
        rng.restore(extras["rng"])
