"""Configuration of ``stalwart run``: one pydantic model, validated on construction.

Precedence: defaults < file (``--config`` YAML/TOML) < environment (``STALWART_<FIELD>``) < flags.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError
from ..inputs import parse_yaml, read_text_file, validate_run_dir
from ..node_name import validate_node_name
from ..policy.restart_policy import RestartBudget
from ..policy.timeouts import HangTimeoutPolicy, validate_hierarchy
from ..protocol import (
    DEFAULT_HANG_CAP_S,
    DEFAULT_HANG_FLOOR_S,
    DEFAULT_PG_TIMEOUT_S,
    DEFAULT_STARTUP_TIMEOUT_S,
)
from .output import parse_streams


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    script: str
    script_args: list[str] = Field(default_factory=list)
    module: bool = False  # run ``python -m script``
    nproc_per_node: int = Field(1, ge=1, le=1024)
    nnodes: str = "1"
    # torchrun's flags (same meaning and values; see docs/resilient-run.md)
    rdzv_backend: str = ""  # "": c10d when --rdzv-endpoint is given, else static (torchrun's default)
    rdzv_conf: str = ""
    standalone: bool = False
    node_rank: int = Field(0, ge=0)
    master_addr: str = ""
    master_port: int = Field(0, ge=0, le=65535)  # 0: a free port per attempt
    role: str = "default"
    no_python: bool = False
    run_path: bool = False
    start_method: str = "spawn"
    log_dir: Path | None = None
    redirects: str = "0"
    tee: str = "0"
    local_ranks_filter: str = ""
    duplicate_stdout_filters: str = ""
    duplicate_stderr_filters: str = ""
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    virtual_local_rank: bool = False
    event_log_handler: str = "null"
    logs_specs: str = ""
    numa_binding: str = ""
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
    hang_floor_s: float = Field(DEFAULT_HANG_FLOOR_S, gt=0)
    hang_cap_s: float = Field(DEFAULT_HANG_CAP_S, gt=0)
    startup_timeout_s: float = Field(DEFAULT_STARTUP_TIMEOUT_S, gt=0)
    hang_min_samples: int = Field(5, ge=1)
    cpu_stall_s: float = Field(DEFAULT_HANG_FLOOR_S * 3, gt=0)
    pg_timeout_s: float = Field(DEFAULT_PG_TIMEOUT_S, gt=0)
    stop_grace_s: float = Field(3.0, gt=0)
    emergency_deadline_s: float = Field(30.0, gt=0)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(30.0, ge=0)
    chaos: list[str] = Field(default_factory=list)
    chaos_file: str = ""
    health_gate: bool = True
    # warm starts (launch/warm.py): workers forked from a fork server; the attempt whose warm start is
    # forced to fail (chaos/testing, STALWART_WARM_FAIL_ATTEMPT), -1 for none
    warm: bool = True
    warm_fail_attempt: int = Field(-1, ge=-1)
    health_fixture: Path | None = None
    health_active: bool = False
    health_backend: str = "local"
    health_state_dir: Path | None = None
    valid_sizes: str = "any"
    python: str = sys.executable
    quiet: bool = False
    # observability (serve/): Prometheus exporter for this run (None = off) and notification targets
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_addr: str = "127.0.0.1"
    metrics_model: str = ""  # model spec for tokens/s and MFU (serve.snapshot.parse_model_spec)
    notify: list[str] = Field(default_factory=list)
    # live diagnosis (diagnose/live.py): where this node's evidence comes from; interval 0 = off
    topology: Path | None = None
    facility: str = ""
    facility_query: list[str] = Field(default_factory=list)
    kernel_log: Path | None = None
    node_telemetry: Path | None = None
    diagnose_interval_s: float = Field(2.0, ge=0)
    # straggler -> action (diagnose/straggler_action.py): observe | auto | act, the precision gate, costs
    straggler_action: str = "observe"
    straggler_act_min_precision: float = Field(0.9, ge=0, le=1)
    straggler_act_min_firings: int = Field(5, ge=1)
    straggler_history: Path | None = None  # a run dir or ledger file whose firings add to the precision
    straggler_recovery_s: float = Field(300.0, ge=0)
    straggler_margin: float = Field(1.5, ge=1)
    straggler_min_confidence: float = Field(0.8, ge=0, le=1)

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

    @field_validator("metrics_model")
    @classmethod
    def _model_spec(cls, v: str) -> str:
        if v:
            from ..account.mfu import parse_model_spec
            from ..errors import ConfigError

            try:
                parse_model_spec(v)
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("--model: ")) from None
        return v

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

    @field_validator("rdzv_backend")
    @classmethod
    def _rdzv_backend(cls, v: str) -> str:
        if v not in ("", "static", "c10d"):
            raise ValueError(f"--rdzv-backend {v!r} is not supported: use static or c10d")
        return v

    @field_validator("start_method")
    @classmethod
    def _start_method(cls, v: str) -> str:
        if v not in ("spawn", "fork", "forkserver"):
            raise ValueError(f"--start-method {v!r} must be spawn, fork or forkserver")
        return v

    @field_validator("numa_binding")
    @classmethod
    def _numa(cls, v: str) -> str:
        if v not in ("", "node", "socket", "exclusive", "core-complex"):
            raise ValueError(f"--numa-binding {v!r} must be node, socket, exclusive or core-complex")
        return v

    @field_validator("redirects", "tee", mode="before")
    @classmethod
    def _streams(cls, v: str, info) -> str:
        parse_streams(str(v), 1, flag="--" + info.field_name)  # raises ValueError with the flag's name
        return str(v)

    @field_validator("local_ranks_filter")
    @classmethod
    def _ranks_filter(cls, v: str) -> str:
        if v and not all(x.strip().isdigit() for x in v.split(",")):
            raise ValueError(f"--local-ranks-filter {v!r} must be local ranks separated by commas, e.g. 0,1")
        return v

    @field_validator("signals_to_handle")
    @classmethod
    def _signals(cls, v: str) -> str:
        import signal as _signal

        for name in (x.strip() for x in v.split(",") if x.strip()):
            if not hasattr(_signal, name) or not name.startswith("SIG"):
                raise ValueError(f"--signals-to-handle: unknown signal {name!r} (e.g. SIGTERM,SIGUSR1)")
        return v

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: list[str]) -> list[str]:
        for url in v:
            if not url.removeprefix("generic:").startswith(("http://", "https://")):
                raise ValueError(
                    f"--notify {url!r} is not http(s): give http(s)://host/path or generic:http(s)://..."
                )
        return v

    @field_validator("straggler_action")
    @classmethod
    def _straggler_action(cls, v: str) -> str:
        from ..diagnose.straggler_action import STRAGGLER_MODES

        if v not in STRAGGLER_MODES:
            raise ValueError(f"--straggler-action {v!r} must be {', '.join(STRAGGLER_MODES)}")
        return v

    @property
    def straggler_policy(self):
        """The straggler-action policy's settings (diagnose/straggler_action.py)."""
        from ..diagnose.straggler_action import StragglerActionConfig

        return StragglerActionConfig(
            min_confidence=self.straggler_min_confidence,
            margin=self.straggler_margin,
            recovery_s=self.straggler_recovery_s,
        )

    @field_validator("health_backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in ("local", "slurm"):
            raise ValueError(f"--health-backend {v!r} must be local or slurm")
        return v

    def diagnosis_sources(self):
        from ..diagnose.live import validate_sources

        src = validate_sources(
            self.topology, self.facility, self.facility_query, self.kernel_log, self.node_telemetry
        )
        return src.model_copy(update={"interval_s": self.diagnose_interval_s or 1.0})

    @property
    def size_rule(self):
        from ..policy.world_size import SizeRule

        kind, _, n = self.valid_sizes.partition(":")
        if kind == "pow2":
            return SizeRule("power_of_two")
        return SizeRule("multiple", int(n) if n else 1)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.topology or self.facility or self.facility_query or self.kernel_log or self.node_telemetry:
            self.diagnosis_sources()  # a bad topology or facility source stops the run before it starts
        if self.straggler_history is not None and not self.straggler_history.exists():
            raise ValueError(
                f"--straggler-history {self.straggler_history} does not exist: give a run directory or a "
                ".ledger file"
            )
        if self.run_dir is not None:
            validate_run_dir(self.run_dir)  # not /, /proc, /sys, /dev or a file
        if self.node_name:
            validate_node_name(self.node_name, "--node-name")  # becomes paths and scontrol arguments
        if self.run_path and not Path(self.script).is_absolute():
            raise ValueError("--run-path needs the script as an absolute path (as torchrun)")
        if self.max_nodes > 1 and not self.standalone and not self.use_c10d:
            if self.min_nodes != self.max_nodes:
                raise ValueError(
                    "an elastic --nnodes MIN:MAX needs --rdzv-endpoint HOST:PORT (c10d rendezvous)"
                )
            if not self.master_addr:
                raise ValueError(
                    "--nnodes with more than one node needs --master-addr/--master-port (static) "
                    "or --rdzv-backend c10d --rdzv-endpoint HOST:PORT"
                )
            if self.node_rank >= self.max_nodes:
                raise ValueError(f"--node-rank {self.node_rank} must be below --nnodes {self.max_nodes}")
        if self.max_nodes > 1 and self.use_c10d and not self.rdzv_endpoint:
            raise ValueError("--nnodes with more than one node needs --rdzv-endpoint HOST:PORT")
        if self.standalone and self.max_nodes > 1:
            raise ValueError("--standalone runs a single node: drop it or use --nnodes 1")
        if self.rdzv_endpoint:
            host, sep, port = self.rdzv_endpoint.rpartition(":")
            if (
                not sep
                or not host
                or not port.isdigit()
                or not 0 < int(port) < 65536
                or ":" in host.strip("[]")
            ):
                raise ValueError(
                    f"--rdzv-endpoint {self.rdzv_endpoint!r} must be HOST:PORT (e.g. head-node:29400)"
                )
        rule = self.size_rule
        if not any(rule.valid(n * self.nproc_per_node) for n in range(self.min_nodes, self.max_nodes + 1)):
            raise ValueError(
                f"--valid-sizes {self.valid_sizes}: no world size of {self.nproc_per_node} process(es) per node "
                f"on {self.nnodes} node(s) is {rule.describe()}"
            )
        if self.chaos or self.chaos_file:
            from ..chaos.plan import build_plan

            build_plan(self.chaos, self.chaos_file or None).check_world(
                self.nproc_per_node * self.max_nodes, self.max_nodes
            )
        validate_hierarchy(
            monitor_interval_s=self.monitor_interval_s,
            policy=self.hang_policy,
            pg_timeout_s=self.pg_timeout_s,
            rdzv_timeout_s=self.rdzv_timeout_s,
            stop_grace_s=self.stop_grace_s,
        )
        if self.cpu_stall_s >= self.pg_timeout_s:
            raise ValueError(
                f"--cpu-stall {self.cpu_stall_s:g}s must be below the process-group timeout "
                f"{self.pg_timeout_s:g}s, or ranks time out before the hang is seen"
            )
        return self

    @property
    def use_c10d(self) -> bool:
        """Agents meet through the c10d rendezvous (else: one node, or static node ranks)."""
        if self.standalone:
            return False
        return self.rdzv_backend == "c10d" or (self.rdzv_backend == "" and bool(self.rdzv_endpoint))

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

    def resolved(self, env: dict[str, str] | None = None) -> RunConfig:
        """Fill run id, run dir, node name and rendezvous id defaults."""
        run_id = stable_run_id(self, os.environ if env is None else env)
        run_dir = self.run_dir or Path("stalwart-runs") / run_id
        node = self.node_name or socket.gethostname()
        rdzv_id = run_id if self.standalone or not self.rdzv_id else self.rdzv_id
        return self.model_copy(
            update={
                "run_id": run_id,
                "run_dir": run_dir.absolute(),
                "node_name": node,
                "rdzv_id": rdzv_id,
                "health_state_dir": self.health_state_dir or run_dir.absolute() / "health",
            }
        )

    def identity(self) -> dict[str, Any]:
        """What makes two invocations the same run (a re-run resumes it)."""
        script = self.script if self.module or self.no_python else str(Path(self.script).absolute())
        return {"script": script, "module": self.module}


def stable_run_id(cfg: RunConfig, env: dict[str, str]) -> str:
    """The same job gets the same id when it runs again, so a requeue resumes: ``--run-id``, else
    the Slurm job (and array task), else ``--rdzv-id``, else a hash of the command line."""
    if cfg.run_id:
        return cfg.run_id
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    if cfg.rdzv_id and not cfg.standalone:
        return cfg.rdzv_id
    line = json.dumps([cfg.identity(), cfg.script_args, cfg.nnodes, cfg.nproc_per_node, os.getcwd()])
    stem = Path(cfg.script).stem if not cfg.module else cfg.script.rsplit(".", 1)[-1]
    return f"{stem}-{hashlib.sha256(line.encode()).hexdigest()[:12]}"


def claim_run_dir(cfg: RunConfig) -> None:
    """Record what the run dir belongs to; a different script reusing it is bad input (exit 2)."""
    path = Path(cfg.run_dir) / "run.json"
    mine = {"run_id": cfg.run_id, **cfg.identity()}
    try:
        theirs = json.loads(path.read_text())
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(mine))
        os.replace(tmp, path)
        return
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"run dir {cfg.run_dir} has an unreadable run.json ({exc})", "give another --run-id or --run-dir"
        ) from None
    if (
        not isinstance(theirs, dict)
        or theirs.get("script") != mine["script"]
        or theirs.get("module") != mine["module"]
    ):
        other = theirs.get("script") if isinstance(theirs, dict) else "?"
        raise ConfigError(
            f"run id {cfg.run_id!r} belongs to another run (script {other}, run dir {cfg.run_dir})",
            "give another --run-id, or --run-dir for this script",
        )


_FIELDS = set(RunConfig.model_fields)
CONFIG_SETTINGS = frozenset(
    _FIELDS
)  # STALWART_<SETTING> variables configure a run; workers do not inherit them
_LISTS = {"script_args", "chaos", "notify"}


_RDZV_CONF = {
    "join_timeout": "rdzv_timeout_s",
    "timeout": "rdzv_timeout_s",
    "last_call_timeout": "rdzv_last_call_s",
    "keep_alive_interval": "rdzv_keepalive_s",
    "is_host": "rdzv_host",
}
_RDZV_IGNORED = {"close_timeout", "keep_alive_max_attempt", "read_timeout", "use_libuv", "store_type"}


def parse_rdzv_conf(text: str) -> dict[str, Any]:
    """torchrun's ``--rdzv-conf key=value,...`` as settings of this run."""
    out: dict[str, Any] = {}
    for item in (x for x in text.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--rdzv-conf {text!r}: {item!r} is not key=value")
        if key in _RDZV_CONF:
            out[_RDZV_CONF[key]] = value.strip()
        elif key not in _RDZV_IGNORED:
            raise ConfigError(
                f"--rdzv-conf: unknown key {key!r}",
                f"known keys: {', '.join(sorted(_RDZV_CONF) + sorted(_RDZV_IGNORED))}",
            )
    return out


def load_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    text = read_text_file(p, 1 << 20, "config file")  # a regular UTF-8 file of at most 1 MiB
    if p.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as exc:
            raise ConfigError(f"config file {p} does not parse: {str(exc).splitlines()[0]}") from None
    else:
        data = parse_yaml(text, f"config file {p}")
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of settings")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"config file {p}: setting names must be text, got {bad[0]!r}")
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
