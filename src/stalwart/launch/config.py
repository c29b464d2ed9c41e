"""Configuration of ``stalwart run``: one pydantic model, validated on construction.

Precedence: defaults < file (``--config`` YAML/TOML) < environment (``STALWART_<FIELD>``) < flags.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

import tomllib
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError
from ..inputs import validate_run_dir
from ..node_name import validate_node_name
from .restart_policy import RestartBudget
from .timeouts import HangTimeoutPolicy, validate_hierarchy


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    script: str
    script_args: list[str] = Field(default_factory=list)
    module: bool = False  # run ``python -m script``
    nproc_per_node: int = Field(1, ge=1, le=1024)
    nnodes: str = "1"
    max_restarts: int = Field(3, ge=0)
    max_user_error_restarts: int = Field(1, ge=0)
    run_id: str = ""
    run_dir: Path | None = None
    node_name: str = ""
    rdzv_endpoint: str = ""
    rdzv_id: str = ""
    rdzv_timeout_s: float = Field(900.0, gt=0)
    rdzv_last_call_s: float = Field(3.0, ge=0)
    rdzv_keepalive_s: float = Field(1.0, gt=0)
    rdzv_host: bool | None = None
    local_addr: str = ""
    monitor_interval_s: float = Field(0.05, gt=0)
    hang_multiplier: float = Field(3.0, gt=0)
    hang_floor_s: float = Field(10.0, gt=0)
    hang_cap_s: float = Field(300.0, gt=0)
    startup_timeout_s: float = Field(300.0, gt=0)
    hang_min_samples: int = Field(5, ge=1)
    pg_timeout_s: float = Field(600.0, gt=0)
    stop_grace_s: float = Field(3.0, gt=0)
    emergency_deadline_s: float = Field(30.0, gt=0)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(30.0, ge=0)
    chaos: list[str] = Field(default_factory=list)
    chaos_file: str = ""
    health_gate: bool = True
    health_fixture: Path | None = None
    health_active: bool = False
    health_backend: str = "local"
    health_state_dir: Path | None = None
    valid_sizes: str = "any"
    python: str = sys.executable
    tee: bool = False
    quiet: bool = False

    @field_validator("nnodes")
    @classmethod
    def _nnodes(cls, v: str) -> str:
        lo, _, hi = str(v).partition(":")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"--nnodes {v!r} must be N or MIN:MAX (e.g. 1:2)") from None
        if a < 1 or b < a:
            raise ValueError(f"--nnodes {v!r} needs 1 <= MIN <= MAX")
        return f"{a}:{b}"

    @field_validator("valid_sizes")
    @classmethod
    def _sizes(cls, v: str) -> str:
        kind, _, n = v.partition(":")
        if kind in ("any", "pow2") and not n:
            return v
        if kind == "multiple" and n.isdigit() and int(n) >= 1:
            return v
        raise ValueError(
            f"--valid-sizes {v!r} must be any, pow2 or multiple:N (e.g. multiple:8 for TP x PP = 8)"
        )

    @field_validator("health_backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in ("local", "slurm"):
            raise ValueError(f"--health-backend {v!r} must be local or slurm")
        return v

    @property
    def size_rule(self):
        from .world_size import SizeRule

        kind, _, n = self.valid_sizes.partition(":")
        if kind == "pow2":
            return SizeRule("power_of_two")
        return SizeRule("multiple", int(n) if n else 1)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        validate_run_dir(self.run_dir) if self.run_dir is not None else None  # h-reliab: not /, /proc, a file
        validate_node_name(self.node_name, "--node-name") if self.node_name else None  # h-reliab: one host
        if self.max_nodes > 1 and not self.rdzv_endpoint:
            raise ValueError("--nnodes with more than one node needs --rdzv-endpoint HOST:PORT")
        validate_hierarchy(
            monitor_interval_s=self.monitor_interval_s,
            policy=self.hang_policy,
            pg_timeout_s=self.pg_timeout_s,
            rdzv_timeout_s=self.rdzv_timeout_s,
            stop_grace_s=self.stop_grace_s,
        )
        return self

    @property
    def min_nodes(self) -> int:
        return int(self.nnodes.split(":")[0])

    @property
    def max_nodes(self) -> int:
        return int(self.nnodes.split(":")[-1])

    @property
    def hang_policy(self) -> HangTimeoutPolicy:
        return HangTimeoutPolicy(
            self.hang_multiplier,
            self.hang_floor_s,
            self.hang_cap_s,
            self.startup_timeout_s,
            self.hang_min_samples,
        )

    @property
    def budget(self) -> RestartBudget:
        return RestartBudget(
            self.max_restarts, self.max_user_error_restarts, self.backoff_base_s, self.backoff_max_s
        )

    def resolved(self) -> RunConfig:
        """Fill run id, run dir, node name and rendezvous id defaults."""
        run_id = self.run_id or self.rdzv_id or uuid.uuid4().hex[:12]
        run_dir = self.run_dir or Path("stalwart-runs") / run_id
        node = self.node_name or socket.gethostname()
        return self.model_copy(
            update={
                "run_id": run_id,
                "run_dir": run_dir.absolute(),
                "node_name": node,
                "rdzv_id": self.rdzv_id or run_id,
                "health_state_dir": self.health_state_dir or run_dir.absolute() / "health",
            }
        )


_FIELDS = set(RunConfig.model_fields)
_LISTS = {"script_args", "chaos"}


def load_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {p} does not parse: {str(exc).splitlines()[0]}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of settings")
    data = {k.replace("-", "_"): v for k, v in data.items()}
    unknown = set(data) - _FIELDS
    if unknown:
        raise ConfigError(
            f"config file {p}: unknown setting(s) {', '.join(sorted(unknown))}",
            "see 'stalwart run --help' for the settings",
        )
    return data


def from_env(env: dict[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    for name in _FIELDS - {"script", "script_args"}:
        key = f"STALWART_{name.upper()}"
        if key in env:
            out[name] = env[key].split(";") if name in _LISTS else env[key]
    return out


def build(
    flags: dict[str, Any], *, config_file: str | None = None, env: dict[str, str] | None = None
) -> RunConfig:
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(load_file(config_file))
    merged.update(from_env(env))
    merged.update({k: v for k, v in flags.items() if v is not None})
    try:
        return RunConfig(**merged).resolved()
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"invalid setting {loc}: {msg}" if loc != "config" else msg) from None
    except ConfigError:
        raise
