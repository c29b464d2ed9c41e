"""Model FLOPs utilisation (MFU) from model dimensions and the dense peak of the hardware.

Formula: Chowdhery et al., "PaLM: Scaling Language Modeling with Pathways" (arXiv 2204.02311),
Appendix B: training FLOPs per token = ``6 N + 12 L H Q T`` for a decoder-only transformer with
``N`` (non-embedding) parameters, ``L`` layers, ``H`` heads, head dimension ``Q`` and sequence length
``T``; the second term is the attention (QK^T and AV) matmuls, forward + backward. Rematerialisation is
*not* counted (that would be hardware FLOPs utilisation, HFU). With ``causal=True`` the attention
term is halved, the convention of some later reports (e.g. Megatron-LM's FLOP counter with causal
masking); PaLM's figure counts it in full, so the default is ``causal=False``.

``MFU = tokens_per_s * flops_per_token / (num_gpus * peak_flops)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError

# Dense (no structured sparsity) peak matmul throughput per device, TFLOP/s, from vendor datasheets.
# Datasheets usually print the 2:4-sparse figure; the dense figure is half of it.
DENSE_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 SXM datasheet: BF16 312 dense (624 sparse), TF32 156 dense
    "a100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0},
    # NVIDIA H100 SXM datasheet: BF16 1,979 sparse -> 989.4 dense; FP8 3,958 sparse -> 1,978.9 dense
    "h100": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7},
    # NVIDIA H100 PCIe datasheet: BF16 1,513 sparse -> 756.5 dense
    "h100-pcie": {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
    # NVIDIA H200 SXM datasheet: same tensor cores as H100 SXM (BF16 1,979 sparse)
    "h200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    # NVIDIA HGX B200 datasheet: BF16 4.5 PFLOPS sparse per GPU -> 2,250 dense; FP8 9 sparse -> 4,500
    "b200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    # Google TPU v4: 275 TFLOP/s bf16 per chip (PaLM paper, section 4 / appendix B)
    "tpu-v4": {"bf16": 275.0},
}


def peak_flops(device: str, dtype: str = "bf16") -> float:
    """Dense peak FLOP/s of one device for a dtype, from :data:`DENSE_PEAK_TFLOPS`."""
    d = DENSE_PEAK_TFLOPS.get(device.lower())
    if d is None:
        raise ConfigError(
            f"unknown device {device!r}",
            f"known: {', '.join(sorted(DENSE_PEAK_TFLOPS))}; or pass peak FLOP/s directly",
        )
    if dtype not in d:
        raise ConfigError(f"no {dtype} peak recorded for {device}", f"known dtypes: {', '.join(sorted(d))}")
    return d[dtype] * 1e12


@dataclass(frozen=True)
class ModelDims:
    params: float  # non-embedding parameters
    layers: int
    heads: int
    head_dim: int
    seq_len: int

    def __post_init__(self) -> None:
        for name in ("params", "layers", "heads", "head_dim", "seq_len"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"model {name} must be positive, got {v!r}")


def flops_per_token(dims: ModelDims, *, causal: bool = False) -> float:
    """Training FLOPs per token: 6N + 12 L H Q T (PaLM appendix B); attention halved if ``causal``."""
    attn = 12.0 * dims.layers * dims.heads * dims.head_dim * dims.seq_len
    return 6.0 * dims.params + (attn / 2.0 if causal else attn)


def mfu(
    dims: ModelDims, tokens_per_s: float, num_gpus: int, peak_flops_per_gpu: float, *, causal: bool = False
) -> float:
    """Model FLOPs utilisation in [0, 1] (can exceed 1 only if the inputs are inconsistent)."""
    if not (tokens_per_s >= 0 and math.isfinite(tokens_per_s)):
        raise ConfigError(f"throughput must be non-negative tokens/s, got {tokens_per_s!r}")
    if num_gpus <= 0:
        raise ConfigError(f"number of GPUs must be positive, got {num_gpus}")
    if not peak_flops_per_gpu > 0:
        raise ConfigError(
            f"peak FLOP/s must be positive, got {peak_flops_per_gpu!r}",
            "pass FLOP/s (e.g. 989.4e12 for H100 bf16), not TFLOP/s",
        )
    return tokens_per_s * flops_per_token(dims, causal=causal) / (num_gpus * peak_flops_per_gpu)


def mfu_from_step(
    dims: ModelDims,
    global_batch_tokens: float,
    step_s: float,
    num_gpus: int,
    peak_flops_per_gpu: float,
    *,
    causal: bool = False,
) -> float:
    """MFU from one step's token count and duration (e.g. the ideal step time of the goodput report)."""
    if not step_s > 0:
        raise ConfigError(f"step time must be positive seconds, got {step_s!r}")
    return mfu(dims, global_batch_tokens / step_s, num_gpus, peak_flops_per_gpu, causal=causal)


@dataclass(frozen=True)
class ModelSpec:
    """What MFU needs besides step times: model dimensions, tokens per step, GPUs and their peak."""

    dims: ModelDims
    tokens_per_step: float
    num_gpus: int
    peak_flops_per_gpu: float


_SPEC_KEYS = {
    "params",
    "layers",
    "heads",
    "head_dim",
    "seq_len",
    "tokens_per_step",
    "gpus",
    "device",
    "dtype",
}


# the help of every --model flag: key=value pairs with a space after each comma, so help text wraps
# between them instead of inside one (the parser strips the spaces)
MODEL_SPEC_HELP = (
    "key=value pairs joined by commas: params=7e9, layers=32, heads=32, head_dim=128, "
    "seq_len=4096, tokens_per_step=4e6, gpus=64, device=h100 (dtype=bf16 optional)"
)


def parse_model_spec(text: str) -> ModelSpec:
    """``params=7e9,layers=32,heads=32,head_dim=128,seq_len=4096,tokens_per_step=4e6,gpus=64,device=h100``
    (``dtype`` defaults to bf16): what ``stalwart metrics serve --model`` takes."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in _SPEC_KEYS:
            raise ConfigError(
                f"--model: bad item {part!r}", f"use key=value with keys {', '.join(sorted(_SPEC_KEYS))}"
            )
        fields[key] = value
    missing = _SPEC_KEYS - {"dtype"} - set(fields)
    if missing:
        raise ConfigError(f"--model: missing {', '.join(sorted(missing))}")
    try:
        dims = ModelDims(
            float(fields["params"]),
            int(fields["layers"]),
            int(fields["heads"]),
            int(fields["head_dim"]),
            int(fields["seq_len"]),
        )
        tokens, gpus = float(fields["tokens_per_step"]), int(fields["gpus"])
    except ValueError as exc:
        raise ConfigError(f"--model: {exc}", "numbers like 7e9 for params, integers for the rest") from None
    if tokens <= 0 or gpus <= 0:
        raise ConfigError("--model: tokens_per_step and gpus must be positive")
    return ModelSpec(dims, tokens, gpus, peak_flops(fields["device"], fields.get("dtype", "bf16")))
