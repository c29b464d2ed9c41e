"""Silent data corruption on purpose: flip one bit of a tensor a Session's state holds (the chaos
fault ``bitflip``, fired by ``chaos_hook.py``), as ground truth for the cross-replica check.

The victim is fixed, so a test knows what to expect: the first module's first parameter with
elements (a model's first weight), its middle element; its gradient (just before the optimizer
step, after data-parallel averaging, so only this replica's update goes wrong), or the first tensor
of the first optimizer's state for it (Adam's ``exp_avg``, SGD's momentum). The default bit is the
lowest exponent bit of the tensor's type: the value doubles or halves, training stays finite and
the damage stays silent, which is what makes SDC dangerous.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .fingerprint import bits

# the lowest exponent bit of each floating type (its mantissa width)
LOWEST_EXPONENT_BIT = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


def flip(t: torch.Tensor, bit: int = -1) -> str:
    """Flip ``bit`` (-1: the lowest exponent bit) of ``t``'s middle element, in place."""
    view = bits(t.data).view(-1)
    if view.numel() == 0:
        return "an empty tensor: nothing flipped"
    b = bit if bit >= 0 else LOWEST_EXPONENT_BIT.get(t.dtype, 0)
    width = view.element_size() * 8
    if b >= width:
        return f"bit {b} is past the {width} bits of a {t.dtype} element: nothing flipped"
    i = view.numel() // 2
    before = t.data.reshape(-1)[i].item()
    mask = 1 << b if b < width - 1 else -(1 << b)  # the sign bit, as a signed integer of that width
    with torch.no_grad():
        view[i] ^= mask
    return f"bit {b} of element {i}: {before!r} -> {t.data.reshape(-1)[i].item()!r}"


def victim(state: Mapping[str, Any]) -> tuple[str, torch.Tensor] | None:  # Any: user state
    """The parameter a bitflip hits: the first module's first parameter with elements."""
    for key, obj in state.items():
        if isinstance(obj, torch.nn.Module):
            for name, p in obj.named_parameters():
                if p.numel() > 0:
                    return f"{key}.{name}", p
    return None


def optimizer_of(state: Mapping[str, Any]) -> torch.optim.Optimizer | None:  # Any: user state
    return next((o for o in state.values() if isinstance(o, torch.optim.Optimizer)), None)


def flip_state(state: Mapping[str, Any], target: str, bit: int) -> str:  # Any: user state
    """Flip a bit of the victim parameter (``param``) or of its first optimizer state tensor
    (``optim``) now; says what it flipped, or why nothing."""
    found = victim(state)
    if found is None:
        return "no module in the loop's state: nothing flipped"
    name, p = found
    if target == "param":
        return f"{name} {flip(p, bit)}"
    opt = optimizer_of(state)
    held = opt.state.get(p, {}) if opt is not None else {}
    tensors = [(k, v) for k, v in sorted(held.items()) if isinstance(v, torch.Tensor) and v.numel() > 1]
    if not tensors:
        return f"no optimizer state for {name}: nothing flipped"
    k, v = tensors[0]
    return f"optimizer state {k} of {name} {flip(v, bit)}"


def flip_grad_at_next_step(state: Mapping[str, Any], bit: int, done: Any) -> str:  # Any: a callback
    """Flip a bit of the victim's gradient just before the optimizer's next step (a one-shot step
    pre-hook); ``done(text)`` is told what was flipped. Returns "" or why nothing will be."""
    found, opt = victim(state), optimizer_of(state)
    if found is None or opt is None:
        return "no module and optimizer in the loop's state: nothing flipped"
    name, p = found

    def pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:  # Any: torch's hook
        handle.remove()
        done(f"gradient of {name} {flip(p.grad, bit)}" if p.grad is not None else f"{name} has no gradient")

    handle = opt.register_step_pre_hook(pre_step)
    return ""
