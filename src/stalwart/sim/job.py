"""The job being planned: its model, its step time and the bandwidths its state moves at.

One schema (:class:`TargetJob`): each field's ``description`` is the ``stalwart plan`` flag's help,
its :class:`~stalwart.settings.schema.Setting` names the flag, and a field left unset takes the
default of the named model size (:data:`MODEL_SIZES`) or the stated default below. Every derived
figure says what it was derived from (:meth:`TargetJob.describe`).

Defaults and their sources (docs/simulator.md, "The target job"):

* state held per GPU: bf16 weights (2 bytes per parameter) split over the model-parallel group
  (tensor x pipeline parallel), plus fp32 master weights and Adam moments (12 bytes per parameter)
  sharded over every GPU, as Llama 3 405B trained (TP 8 x PP 16, sharded optimizer; "The Llama 3
  Herd of Models", arXiv 2407.21783, section 3.3);
* a checkpoint holds one copy: 14 bytes per parameter;
* step time from the FLOPs: 6 x parameters x tokens per GPU per step / achieved FLOP/s per GPU (the
  batch grows with the job); Llama 3 405B ran 16M-token batches (1,024 tokens per GPU) at 400 TFLOP/s
  per H100 on 16,384 GPUs (same paper, Table 4);
* storage: Meta's Tectonic served Llama 3's checkpoints at 2 TB/s sustained (same paper, 3.3.4);
* network: 400 Gb/s per GPU (same paper, 3.3.1), 50 GB/s;
* host <-> GPU copies: 25 GB/s per GPU (our assumption: PCIe Gen5 x16 is 64 GB/s nominal, and
  pinned-memory copies reach well under that);
* CUDA context and library handles of a fresh process: 5 s (our assumption; no GPU measured here).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError
from ..settings.schema import setting
from .laws import Figure, Source

GB = 1e9
WEIGHT_BYTES = 2.0  # bf16 weights, per parameter
OPTIMIZER_BYTES = 12.0  # fp32 master weights + Adam's two moments, per parameter


class ModelSize(BaseModel):
    """A named model size's defaults."""

    model_config = ConfigDict(frozen=True)
    params: float
    model_parallel: int
    why: str


MODEL_SIZES: dict[str, ModelSize] = {
    "8b": ModelSize(params=8.0e9, model_parallel=8, why="TP 8 within a node (our assumption)"),
    "70b": ModelSize(params=70.6e9, model_parallel=32, why="TP 8 x PP 4 (our assumption)"),
    "405b": ModelSize(params=405e9, model_parallel=128, why="TP 8 x PP 16, as Llama 3 405B trained"),
}

_JOB = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TargetJob(BaseModel):
    """The job the plan is for (``stalwart plan`` flags; unset: the named model's default)."""

    model_config = _JOB

    model: Annotated[
        Literal["8b", "70b", "405b"],
        setting("model", "--model"),
    ] = Field("405b", description="Named model size whose defaults fill what is not given: 8b, 70b, 405b.")
    params_b: Annotated[float | None, setting("params_b", "--params-b")] = Field(
        None, gt=0, le=1e5, description="Model parameters, billions (default: the named model's)."
    )
    model_parallel: Annotated[int | None, setting("model_parallel", "--model-parallel")] = Field(
        None, ge=1, le=1 << 20, description="GPUs that share one copy of the weights (TP x PP)."
    )
    state_gb_per_gpu: Annotated[float | None, setting("state_gb_per_gpu", "--state-gb-per-gpu")] = Field(
        None, gt=0, le=1e4, description="Training state per GPU, GB (default: from the parameters)."
    )
    step_s: Annotated[float | None, setting("step_s", "--step-s")] = Field(
        None, gt=0, le=1e5, description="Step time, s (default: from tokens per step and TFLOP/s)."
    )
    tokens_per_gpu: Annotated[float, setting("tokens_per_gpu", "--tokens-per-gpu")] = Field(
        1024.0, gt=0, le=1e9, description="Tokens per GPU per step (Llama 3: 16M over 16,384 GPUs)."
    )
    tflops_per_gpu: Annotated[float, setting("tflops_per_gpu", "--tflops-per-gpu")] = Field(
        400.0, gt=0, le=1e5, description="Achieved TFLOP/s per GPU (Llama 3 at 16k H100s: 400)."
    )
    storage_gbps: Annotated[float, setting("storage_gbps", "--storage-gbps")] = Field(
        2000.0, gt=0, le=1e7, description="Checkpoint storage bandwidth, GB/s in all (Tectonic: 2000)."
    )
    network_gbps: Annotated[float, setting("network_gbps", "--network-gbps")] = Field(
        50.0, gt=0, le=1e5, description="Network bandwidth per GPU, GB/s (400 Gb/s: 50)."
    )
    host_gbps: Annotated[float, setting("host_gbps", "--host-gbps")] = Field(
        25.0, gt=0, le=1e5, description="GPU <-> host memory copy bandwidth per GPU, GB/s."
    )
    cuda_init_s: Annotated[float, setting("cuda_init_s", "--cuda-init-s")] = Field(
        5.0, ge=0, le=1e5, description="CUDA context and library set-up of a fresh process, s."
    )
    replica_groups: Annotated[int, setting("replica_groups", "--replica-groups")] = Field(
        8, ge=2, le=1 << 20, description="Replica groups for replica-level recovery (HSDP groups)."
    )

    @property
    def size(self) -> ModelSize:
        return MODEL_SIZES[self.model]

    @property
    def params(self) -> float:
        return self.params_b * 1e9 if self.params_b is not None else self.size.params

    @property
    def mp(self) -> int:
        return self.model_parallel if self.model_parallel is not None else self.size.model_parallel

    def check(self, gpus: int) -> None:
        if gpus > self.mp and gpus % self.mp:
            raise ConfigError(
                f"{gpus:,} GPUs is not a whole number of {self.mp}-GPU model-parallel groups"
                + (f" (the {self.model} default)" if self.model_parallel is None else ""),
                "make --gpus a multiple of it, or set --model / --model-parallel",
            )

    def state_bytes_per_gpu(self, gpus: int) -> Figure:
        """Training state one GPU holds (and loads after a restart)."""
        if self.state_gb_per_gpu is not None:
            return Figure(self.state_gb_per_gpu * GB, Source.GIVEN, "--state-gb-per-gpu")
        value = self.params * WEIGHT_BYTES / min(self.mp, gpus) + self.params * OPTIMIZER_BYTES / gpus
        return Figure(
            value,
            Source.DERIVED,
            f"{self.params / 1e9:g}B parameters: bf16 weights over {min(self.mp, gpus)} model-parallel GPUs "
            f"+ fp32 optimizer state over {gpus:,} GPUs",
        )

    def checkpoint_bytes(self) -> float:
        """One copy of the whole state (what a checkpoint writes)."""
        return self.params * (WEIGHT_BYTES + OPTIMIZER_BYTES)

    def step(self, gpus: int) -> Figure:
        if self.step_s is not None:
            return Figure(self.step_s, Source.GIVEN, "--step-s")
        value = 6.0 * self.params * self.tokens_per_gpu / (self.tflops_per_gpu * 1e12)
        return Figure(
            value,
            Source.DERIVED,
            f"6 x {self.params / 1e9:g}B params x {self.tokens_per_gpu:g} tokens per GPU / "
            f"{self.tflops_per_gpu:g} TFLOP/s",
        )

    # moving the state: each figure is bytes over the bandwidth that limits it
    def staging(self, gpus: int) -> Figure:
        """The checkpoint's stall: copying the state to host memory; the write goes on behind."""
        b = self.state_bytes_per_gpu(gpus).value
        return Figure(
            b / (self.host_gbps * GB), Source.DERIVED, self._per_gpu(b, self.host_gbps, "host copy")
        )

    def persist(self) -> Figure:
        """Writing one copy of the state to storage, in the background."""
        b = self.checkpoint_bytes()
        return Figure(
            b / (self.storage_gbps * GB),
            Source.DERIVED,
            f"{b / GB:,.0f} GB at {self.storage_gbps:,g} GB/s of storage",
        )

    def load_storage(self, gpus: int) -> Figure:
        """Every GPU reads its state back from storage: the storage's bandwidth is shared by all of
        them (weights are read once per data-parallel replica), a GPU's own link caps its read."""
        b = self.state_bytes_per_gpu(gpus).value
        total = b * gpus
        value = max(total / (self.storage_gbps * GB), b / (self.network_gbps * GB))
        return Figure(
            value,
            Source.DERIVED,
            f"{total / GB:,.0f} GB read by {gpus:,} GPUs at {self.storage_gbps:,g} GB/s of storage",
        )

    def load_host(self, gpus: int) -> Figure:
        b = self.state_bytes_per_gpu(gpus).value
        return Figure(
            b / (self.host_gbps * GB), Source.DERIVED, self._per_gpu(b, self.host_gbps, "host copy")
        )

    def load_network(self, gpus: int, what: str) -> Figure:
        b = self.state_bytes_per_gpu(gpus).value
        return Figure(b / (self.network_gbps * GB), Source.DERIVED, self._per_gpu(b, self.network_gbps, what))

    @staticmethod
    def _per_gpu(b: float, gbps: float, what: str) -> str:
        return f"{b / GB:.3g} GB per GPU at {gbps:g} GB/s ({what})"

    def describe(self, gpus: int) -> list[str]:
        """One line per figure of the job, with where it came from."""
        lines = [
            f"model: {self.params / 1e9:g}B parameters"
            + (f" ({self.model} default)" if self.params_b is None else " (given)"),
            f"model-parallel group: {self.mp} GPUs"
            + (f" ({self.size.why})" if self.model_parallel is None else " (given)"),
        ]
        for name, fig in (
            ("state per GPU", self.state_bytes_per_gpu(gpus)),
            ("step time", self.step(gpus)),
        ):
            unit = f"{fig.value / GB:.3g} GB" if name == "state per GPU" else f"{fig.value:.3g} s"
            lines.append(f"{name}: {unit} ({fig.source}: {fig.note})")
        lines.append(
            f"bandwidths: storage {self.storage_gbps:,g} GB/s, network {self.network_gbps:g} GB/s per GPU, "
            f"host copy {self.host_gbps:g} GB/s per GPU; CUDA set-up {self.cuda_init_s:g} s"
        )
        return lines
