"""The exact fingerprint: every single bit flip in any floating type changes it; order does not."""

from __future__ import annotations

import pytest
import torch

from stalwart.train.fingerprint import bits, exact


def _flipped(t: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    out = t.clone()
    view = bits(out).reshape(-1)
    view[index] ^= 1 << bit if bit < view.element_size() * 8 - 1 else -(1 << bit)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_every_bit_of_an_element_changes_the_fingerprint(dtype):
    t = torch.randn(7, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    base = exact([t])
    width = t.element_size() * 8
    for bit in range(width):
        assert not torch.equal(exact([_flipped(t, 13, bit)]), base), f"bit {bit} of {dtype}"


def test_one_element_per_tensor_and_only_the_flipped_tensor_moves():
    a, b = torch.randn(4, 4), torch.randn(3)
    base = exact([a, b])
    assert base.dtype == torch.int64 and base.shape == (2,)
    moved = exact([a, _flipped(b, 1, 30)])
    assert moved[0] == base[0] and moved[1] != base[1]


def test_order_of_elements_does_not_matter_and_no_tensor_is_changed():
    t = torch.randn(64)
    before = t.clone()
    assert torch.equal(exact([t]), exact([t.flip(0)]))
    assert torch.equal(exact([t[::2]]), exact([t[::2].contiguous()]))  # a strided view reads the same bits
    assert torch.equal(t, before)


def test_no_tensors_is_an_empty_vector():
    assert exact([]).numel() == 0
