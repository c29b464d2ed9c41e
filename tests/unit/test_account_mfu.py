"""MFU against PaLM's published figure and the peak table."""

import pytest

from stalwart.account import mfu
from stalwart.errors import ConfigError

PALM_540B = mfu.ModelDims(params=540.35e9, layers=118, heads=48, head_dim=256, seq_len=2048)


def test_palm_540b_mfu():
    # PaLM (arXiv 2204.02311) Table 3: 540B on 6144 TPU v4 chips at 238.3K tokens/s = 46.2% MFU.
    # Tolerance 0.1 percentage point: the paper rounds throughput to 4 digits and MFU to 1 decimal.
    value = mfu.mfu(PALM_540B, 238.3e3, 6144, mfu.peak_flops("tpu-v4"))
    assert value == pytest.approx(0.462, abs=0.001)


def test_attention_term_is_counted():
    no_attn = 6 * PALM_540B.params
    assert mfu.flops_per_token(PALM_540B) - no_attn == pytest.approx(12 * 118 * 48 * 256 * 2048)
    assert mfu.flops_per_token(PALM_540B, causal=True) - no_attn == pytest.approx(6 * 118 * 48 * 256 * 2048)


def test_from_step_equals_from_throughput():
    a = mfu.mfu_from_step(PALM_540B, 2048 * 512, 4.4, 6144, 275e12)
    b = mfu.mfu(PALM_540B, 2048 * 512 / 4.4, 6144, 275e12)
    assert a == pytest.approx(b)


def test_peaks_are_dense():
    assert mfu.peak_flops("h100") == pytest.approx(989.4e12)
    assert mfu.peak_flops("A100") == pytest.approx(312e12)
    assert mfu.peak_flops("h200") == mfu.peak_flops("h100")


def test_bad_input():
    with pytest.raises(ConfigError, match="unknown device"):
        mfu.peak_flops("gtx480")
    with pytest.raises(ConfigError, match="no fp8"):
        mfu.peak_flops("a100", "fp8")
    with pytest.raises(ConfigError):
        mfu.ModelDims(params=0, layers=1, heads=1, head_dim=1, seq_len=1)
    with pytest.raises(ConfigError, match="GPUs"):
        mfu.mfu(PALM_540B, 1.0, 0, 1e12)
    with pytest.raises(ConfigError, match="TFLOP"):
        mfu.mfu(PALM_540B, 1.0, 1, -1)
