"""torchrun's conventions outside the flags themselves: ``PET_*`` variables and ``--nproc-per-node``
values (pure functions)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from typing_extensions import assert_never

from ..errors import ConfigError
from ..policy.label import Label

# torchrun's option dest -> this run's setting (same name unless listed)
_PET = {
    "NNODES": "nnodes",
    "NPROC_PER_NODE": "nproc_per_node",
    "RDZV_BACKEND": "rdzv_backend",
    "RDZV_ENDPOINT": "rdzv_endpoint",
    "RDZV_ID": "rdzv_id",
    "RDZV_CONF": "rdzv_conf",
    "STANDALONE": "standalone",
    "MAX_RESTARTS": "max_restarts",
    "MONITOR_INTERVAL": "monitor_interval_s",
    "START_METHOD": "start_method",
    "EVENT_LOG_HANDLER": "event_log_handler",
    "ROLE": "role",
    "MODULE": "module",
    "NO_PYTHON": "no_python",
    "RUN_PATH": "run_path",
    "LOG_DIR": "log_dir",
    "REDIRECTS": "redirects",
    "TEE": "tee",
    "LOCAL_RANKS_FILTER": "local_ranks_filter",
    "DUPLICATE_STDOUT_FILTERS": "duplicate_stdout_filters",
    "DUPLICATE_STDERR_FILTERS": "duplicate_stderr_filters",
    "NODE_RANK": "node_rank",
    "MASTER_ADDR": "master_addr",
    "MASTER_PORT": "master_port",
    "LOCAL_ADDR": "local_addr",
    "LOGS_SPECS": "logs_specs",
    "NUMA_BINDING": "numa_binding",
    "SIGNALS_TO_HANDLE": "signals_to_handle",
    "SHUTDOWN_TIMEOUT": "stop_grace_s",
    "VIRTUAL_LOCAL_RANK": "virtual_local_rank",
}
_SWITCHES = {"standalone", "module", "no_python", "run_path", "virtual_local_rank"}


def pet_defaults(env: Mapping[str, str]) -> dict[str, str | bool]:
    """Settings from torchrun's ``PET_<FLAG>`` variables (they stand in for flags not given)."""
    out: dict[str, str | bool] = {}
    for name, key in _PET.items():
        value = env.get(f"PET_{name}")
        if value is None:
            continue
        out[key] = value.strip().lower() in ("1", "true", "yes") if key in _SWITCHES else value
    return out


class NprocKind(Label):
    """The named values of ``--nproc-per-node`` (else a positive number)."""

    AUTO = "auto"  # one worker per GPU if any, else per CPU
    CPU = "cpu"
    GPU = "gpu"
    XPU = "xpu"


def resolve_nproc(value: str, *, cpu_count: int | None = None, gpu_count: int | None = None) -> int:
    """``--nproc-per-node``: an integer, or auto (GPUs if any, else CPUs), cpu, gpu, xpu."""
    value = value.strip()
    if value.isdigit() and int(value) >= 1:
        return int(value)
    try:
        kind = NprocKind(value)
    except ValueError:
        raise ConfigError(
            f"--nproc-per-node {value!r} must be a positive number, auto, cpu, gpu or xpu"
        ) from None
    cpus = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    match kind:
        case NprocKind.CPU:
            return cpus
        case NprocKind.AUTO | NprocKind.GPU | NprocKind.XPU:
            gpus = gpu_count if gpu_count is not None else _accelerators(kind)
            if gpus:
                return gpus
            if kind is NprocKind.AUTO:
                return cpus
            raise ConfigError(
                f"--nproc-per-node {value}: no {value.upper()} is visible on this node",
                "give a number of workers, or cpu",
            )
        case _:
            assert_never(kind)


def _accelerators(kind: NprocKind) -> int:
    import torch  # deferred: heavy (torch)

    if kind is NprocKind.XPU:
        return torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
