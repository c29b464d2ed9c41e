"""Configuration of ``stalwart run``: one schema of nested models, validated on construction.

The settings of each concern live in ``settings/schema.py``; where they come from, in
``settings/sources.py``. :func:`build` merges them with pydantic-settings in the order
defaults < file (``--config`` YAML/TOML) < environment (``STALWART_<NAME>``) < flags (see
docs/resilient-run.md#run-configuration).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ..chaos.plan import build_plan
from ..errors import ConfigError
from ..inputs import validate_run_dir
from ..node_name import validate_node_name
from ..policy.restart_policy import RestartBudget
from ..policy.timeouts import HangTimeoutPolicy, validate_hierarchy
from ..policy.world_size import SizeRule
from . import sources as _sources
from .etcd_access import check_etcd_access
from .panels import Group, Panel
from .recovery import InPlaceSettings, SdcSettings
from .schema import (
    ChaosSettings,
    CheckpointSettings,
    DiagnosisSettings,
    HangSettings,
    HealthSettings,
    LogSettings,
    ObserveSettings,
    RendezvousSettings,
    RestartSettings,
    WorkerSettings,
    setting,
)
from .script_fingerprint import fingerprint
from .stragglers import StragglerSettings
from .trust import TrustSettings


class RunConfig(BaseSettings):
    """One run of ``stalwart run``. Constructed directly it reads only its arguments (flat names
    such as ``hang_floor_s`` are accepted); :func:`build` adds the file and the environment. Read
    settings by their place: ``cfg.hang.floor_s``."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    script: Annotated[str, setting("script", argument=True, panel=Panel.TORCHRUN)] = Field(
        description="Training script (or module with -m) followed by its arguments."
    )
    script_args: Annotated[list[str], setting("script_args", argument=True, panel=Panel.TORCHRUN)] = Field(
        default_factory=list, description="Arguments passed to the script."
    )
    module: Annotated[bool, setting("module", "-m", "--module", panel=Panel.TORCHRUN)] = Field(
        default=False, description="Run SCRIPT as a module (python -m)."
    )
    no_python: Annotated[bool, setting("no_python", "--no-python", "--no_python", panel=Panel.TORCHRUN)] = (
        Field(default=False, description="Execute SCRIPT directly.")
    )
    run_path: Annotated[bool, setting("run_path", "--run-path", "--run_path", panel=Panel.TORCHRUN)] = Field(
        default=False, description="Run SCRIPT (absolute path) via runpy."
    )
    python: str = Field(default=sys.executable, description="The interpreter that runs the workers.")
    nproc_per_node: Annotated[
        int,
        setting("nproc_per_node", "--nproc-per-node", "--nproc_per_node", cli_type=str, panel=Panel.TORCHRUN),
    ] = Field(default=1, ge=1, le=1024, description="Workers per node: N, auto, cpu, gpu or xpu.")
    nnodes: Annotated[str, setting("nnodes", "--nnodes", panel=Panel.TORCHRUN)] = Field(
        default="1", description="Nodes: N or MIN:MAX (elastic)."
    )
    valid_sizes: Annotated[str, setting("valid_sizes", "--valid-sizes", panel=Panel.RECOVERY)] = Field(
        default="any", description="Valid world sizes: any, pow2 or multiple:N; extra nodes are hot spares."
    )
    monitor_interval_s: Annotated[
        float, setting("monitor_interval_s", "--monitor-interval", "--monitor_interval", panel=Panel.TORCHRUN)
    ] = Field(default=0.05, gt=0, description="Agent poll interval, seconds.")
    run_id: Annotated[str, setting("run_id", "--run-id", panel=Panel.RUN)] = Field(
        default="", description="Run id (default: Slurm job id, --rdzv-id, or a hash of the command line)."
    )
    run_dir: Annotated[Path | None, setting("run_dir", "--run-dir", panel=Panel.RUN)] = Field(
        default=None, description="Where ledger, checkpoints and logs go."
    )
    continue_changed: Annotated[bool, setting("continue_changed", "--continue-changed", panel=Panel.RUN)] = (
        Field(
            default=False,
            description="Resume this run id although the script changed since the run started "
            "(otherwise bad input, exit 2).",
        )
    )
    node_name: Annotated[str, setting("node_name", "--node-name", panel=Panel.RUN)] = Field(
        default="", description="Name of this node in the ledger (default hostname)."
    )
    quiet: Annotated[bool, setting("quiet", "--quiet", "-q", panel=Panel.RUN)] = Field(
        default=False, description="Print only the verdict."
    )

    # the settings of each concern (frozen models: one shared default instance each)
    rendezvous: Annotated[RendezvousSettings, Group(Panel.TORCHRUN)] = RendezvousSettings()
    workers: Annotated[WorkerSettings, Group(Panel.TORCHRUN)] = WorkerSettings()
    logs: Annotated[LogSettings, Group(Panel.TORCHRUN)] = LogSettings()
    restart: Annotated[RestartSettings, Group(Panel.RECOVERY)] = RestartSettings()
    hang: Annotated[HangSettings, Group(Panel.HANGS)] = HangSettings()
    checkpoint: Annotated[CheckpointSettings, Group(Panel.RECOVERY, sdk=True)] = CheckpointSettings()
    faults: Annotated[ChaosSettings, Group(Panel.CHAOS)] = ChaosSettings()
    health: Annotated[HealthSettings, Group(Panel.HEALTH)] = HealthSettings()
    reform: Annotated[InPlaceSettings, Group(Panel.RECOVERY, sdk=True)] = InPlaceSettings()
    sdc: Annotated[SdcSettings, Group(Panel.RECOVERY, sdk=True)] = SdcSettings()
    observe: Annotated[ObserveSettings, Group(Panel.OBSERVABILITY)] = ObserveSettings()
    diagnosis: Annotated[DiagnosisSettings, Group(Panel.DIAGNOSIS)] = DiagnosisSettings()
    straggler: Annotated[StragglerSettings, Group(Panel.DIAGNOSIS)] = StragglerSettings()
    trust: Annotated[TrustSettings, Group(Panel.MULTI_NODE)] = TrustSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)  # constructed in code: its arguments only (build() adds the rest)

    @classmethod
    def sources(
        cls, flags: Mapping[str, object], config_file: str | None, env: Mapping[str, str] | None
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The layers of a run's settings, highest precedence first: flags, then ``STALWART_<NAME>``
        variables, then the ``--config`` file; pydantic-settings merges them over the defaults."""
        return (
            _sources.FlagSource(cls, flags, SETTINGS),
            _sources.EnvSource(cls, env, SETTINGS),
            _sources.FileSource(cls, config_file, SETTINGS),
        )

    @model_validator(mode="before")
    @classmethod
    # Any: a mode='before' validator gets and returns pydantic's raw input
    def _nest_flat_names(cls, data: Any) -> Any:
        return _sources.nest(data, SETTINGS) if isinstance(data, dict) else data

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

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        self._check_inputs()
        self._check_nodes()
        self._check_world()
        late_hosts = self.use_c10d and self.min_nodes < self.max_nodes  # the first round waits for them
        validate_hierarchy(
            monitor_interval_s=self.monitor_interval_s,
            policy=self.hang_policy,
            pg_timeout_s=self.hang.pg_timeout_s,
            rdzv_timeout_s=self.rendezvous.timeout_s,
            stop_grace_s=self.workers.stop_grace_s,
            reform_timeout_s=self.reform.timeout_s,
            announce_s=self.reform.announce_s,
            store_timeout_s=self.rendezvous.store_timeout_s,
            keepalive_s=self.rendezvous.keepalive_s,
            startup_window_s=self.rendezvous.startup_window_s if late_hosts else None,
        )
        if self.hang.cpu_stall_s > self.hang.pg_timeout_s:
            raise ValueError(
                f"--cpu-stall {self.hang.cpu_stall_s:g}s must not exceed the process-group timeout "
                f"{self.hang.pg_timeout_s:g}s (0 means that timeout), or ranks time out before the hang is seen"
            )
        return self

    def _check_inputs(self) -> None:
        """Paths and names given to the run: refused before it starts."""
        if self.diagnosis.configured:
            self.diagnosis_sources()  # a bad topology or facility source stops the run before it starts
        history = self.straggler.history
        if history is not None and not history.exists():
            raise ValueError(
                f"--straggler-history {history} does not exist: give a run directory or a .ledger file"
            )
        if self.run_dir is not None:
            validate_run_dir(self.run_dir)  # not /, /proc, /sys, /dev or a file
        if self.node_name:
            validate_node_name(self.node_name, "--node-name")  # becomes paths and scontrol arguments
        if self.run_path and not Path(self.script).is_absolute():
            raise ValueError("--run-path needs the script as an absolute path (as torchrun)")
        check_etcd_access(self.rendezvous.backend, self.rendezvous.endpoint, self.trust)  # --etcd-*

    def _check_nodes(self) -> None:
        """How the nodes meet: a multi-node run names its rendezvous."""
        rdzv = self.rendezvous
        if self.max_nodes > 1 and not rdzv.standalone and not self.use_c10d:
            if self.min_nodes != self.max_nodes:
                raise ValueError(
                    "an elastic --nnodes MIN:MAX needs --rdzv-endpoint HOST:PORT (c10d rendezvous)"
                )
            if not rdzv.master_addr:
                raise ValueError(
                    "--nnodes with more than one node needs --master-addr/--master-port (static) "
                    "or --rdzv-backend c10d --rdzv-endpoint HOST:PORT"
                )
            if rdzv.node_rank >= self.max_nodes:
                raise ValueError(f"--node-rank {rdzv.node_rank} must be below --nnodes {self.max_nodes}")
        if self.max_nodes > 1 and self.use_c10d and not rdzv.endpoint:
            raise ValueError("--nnodes with more than one node needs --rdzv-endpoint HOST:PORT")
        if rdzv.standalone and self.max_nodes > 1:
            raise ValueError("--standalone runs a single node: drop it or use --nnodes 1")
        for endpoint in rdzv.endpoint.split(",") if rdzv.backend in ("etcd", "etcd-v2") else [rdzv.endpoint]:
            if not endpoint:
                continue
            host, sep, port = (
                endpoint.strip().removeprefix("http://").removeprefix("https://").rpartition(":")
            )
            if not (sep and host and port.isdigit() and 0 < int(port) < 65536) or ":" in host.strip("[]"):
                raise ValueError(
                    f"--rdzv-endpoint {rdzv.endpoint!r} must be HOST:PORT (e.g. head-node:29400)"
                )

    def _check_world(self) -> None:
        """Some world size fits the size rule, and every injected fault has its rank."""
        rule = self.size_rule
        if not any(rule.valid(n * self.nproc_per_node) for n in range(self.min_nodes, self.max_nodes + 1)):
            raise ValueError(
                f"--valid-sizes {self.valid_sizes}: no world size of {self.nproc_per_node} process(es) per node "
                f"on {self.nnodes} node(s) is {rule.describe()}"
            )
        if self.faults.specs or self.faults.file:
            build_plan(self.faults.specs, self.faults.file or None).check_world(
                self.nproc_per_node * self.max_nodes, self.max_nodes
            )

    def diagnosis_sources(self):
        from ..diagnose.live import validate_sources  # deferred: heavy (yaml)

        d = self.diagnosis
        src = validate_sources(d.topology, d.facility, d.facility_query, d.kernel_log, d.node_telemetry)
        return src.model_copy(update={"interval_s": d.interval_s or 1.0})

    @property
    def straggler_policy(self):
        """The straggler-action policy's settings (diagnose/straggler_action.py)."""
        return self.straggler.policy

    @property
    def size_rule(self) -> SizeRule:
        kind, _, n = self.valid_sizes.partition(":")
        if kind == "pow2":
            return SizeRule("power_of_two")
        return SizeRule("multiple", int(n) if n else 1)

    @property
    def use_c10d(self) -> bool:
        """Agents meet through the c10d rendezvous (else: one node, or static node ranks)."""
        rdzv = self.rendezvous
        if rdzv.standalone:
            return False
        return rdzv.backend in ("c10d", "stalwart", "etcd", "etcd-v2") or (
            rdzv.backend == "" and bool(rdzv.endpoint)
        )

    @property
    def min_nodes(self) -> int:
        return int(self.nnodes.split(":")[0])

    @property
    def max_nodes(self) -> int:
        return int(self.nnodes.split(":")[-1])

    @property
    def hang_policy(self) -> HangTimeoutPolicy:
        return self.hang.policy

    @property
    def budget(self) -> RestartBudget:
        r = self.restart
        return RestartBudget(r.max_restarts, r.max_user_error_restarts, r.backoff_base_s, r.backoff_max_s)

    def resolved(self, env: Mapping[str, str] | None = None) -> RunConfig:
        """Fill run id, run dir, node name and rendezvous id defaults."""
        run_id = stable_run_id(self, os.environ if env is None else env)
        run_dir = (self.run_dir or Path("stalwart-runs") / run_id).absolute()
        rdzv = self.rendezvous
        return self.model_copy(
            update={
                "run_id": run_id,
                "run_dir": run_dir,
                "node_name": self.node_name or socket.gethostname(),
                "rendezvous": rdzv.model_copy(
                    update={"id": run_id if rdzv.standalone or not rdzv.id else rdzv.id}
                ),
                "health": self.health.model_copy(
                    update={"state_dir": self.health.state_dir or run_dir / "health"}
                ),
            }
        )

    def identity(self) -> dict[str, str | bool]:
        """What makes two invocations the same run (a re-run resumes it)."""
        script = self.script if self.module or self.no_python else str(Path(self.script).absolute())
        return {"script": script, "module": self.module}


SETTINGS: dict[str, _sources.Leaf] = _sources.leaves(RunConfig)  # flat name -> place in the schema
CONFIG_SETTINGS = frozenset(
    SETTINGS
)  # STALWART_<SETTING> variables configure a run; workers do not inherit them


# Any: each setting's default is of that setting's own type
def default_of(name: str) -> Any:
    """The schema's default of a setting, by flat name (``default_of("hang_cap_s")``)."""
    return SETTINGS[name].field.get_default(call_default_factory=True)


def stable_run_id(cfg: RunConfig, env: Mapping[str, str]) -> str:
    """The same job gets the same id when it runs again, so a requeue resumes: ``--run-id``, else
    the Slurm job (and array task), else ``--rdzv-id``, else a hash of the command line. An explicit
    ``--run-dir`` is part of that line: two jobs of one script in two run dirs are two runs, and must
    not share a node-memory tier named after the id."""
    if cfg.run_id:
        return cfg.run_id
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    if cfg.rendezvous.id and not cfg.rendezvous.standalone:
        return cfg.rendezvous.id
    run_dir = str(cfg.run_dir.absolute()) if cfg.run_dir else None
    line = json.dumps([cfg.identity(), cfg.script_args, cfg.nnodes, cfg.nproc_per_node, os.getcwd(), run_dir])
    stem = Path(cfg.script).stem if not cfg.module else cfg.script.rsplit(".", 1)[-1]
    return f"{stem}-{hashlib.sha256(line.encode()).hexdigest()[:12]}"


def claim_run_dir(cfg: RunConfig) -> None:
    """Record what the run dir belongs to; a different script reusing it is bad input (exit 2)."""
    if cfg.run_dir is None:
        raise ValueError("claim_run_dir needs a resolved configuration (RunConfig.resolved)")
    path = cfg.run_dir / "run.json"
    mine = {
        "run_id": cfg.run_id,
        **cfg.identity(),
        "sha256": fingerprint(cfg.script, cfg.module, cfg.no_python),
    }
    try:
        theirs = json.loads(path.read_text())
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # private, as RunDir.create
        _replace_private(path, mine)
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
    _same_script(cfg, theirs, mine, path)


# Any: the run's identity file as json.loads read it back
def _same_script(cfg: RunConfig, theirs: dict[str, Any], mine: dict[str, Any], path: Path) -> None:
    """zero (issue 25): the script's content changed under the same run id: bad input unless
    --continue-changed (then the new content is recorded)."""
    if theirs.get("sha256", "") == mine.get("sha256", "") or not theirs.get("sha256"):
        return
    if not cfg.continue_changed:
        raise ConfigError(
            f"the script {mine['script']} changed since run {cfg.run_id!r} started (run dir {cfg.run_dir})",
            "resume it anyway with --continue-changed, or start a new run with another --run-id",
        )
    _replace_private(path, {**theirs, "sha256": mine["sha256"]})


# Any: the run's identity file, a JSON document (json.dumps)
def _replace_private(path: Path, record: dict[str, Any]) -> None:
    """``path`` replaced by ``record`` as JSON, in one rename, 0600 as docs/security.md says."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as fh:
        fh.write(json.dumps(record))
    os.replace(tmp, path)


_RDZV_CONF = {
    "join_timeout": "rdzv_timeout_s",
    "timeout": "rdzv_timeout_s",
    "last_call_timeout": "rdzv_last_call_s",
    "keep_alive_interval": "rdzv_keepalive_s",
    "is_host": "rdzv_host",
    "read_timeout": "rdzv_read_timeout_s",
    "startup_window": "rdzv_startup_window_s",
    "cacert": "etcd_cacert",  # torch's etcd rendezvous names for TLS (settings/etcd_access.py)
    "cert": "etcd_cert",
    "key": "etcd_key",
    "user": "etcd_user",
    "password_file": "etcd_password_file",
}
_RDZV_IGNORED = {"close_timeout", "keep_alive_max_attempt", "use_libuv", "store_type"}


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """torchrun's ``--rdzv-conf key=value,...`` as settings of this run."""
    out: dict[str, str] = {}
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


# Any: tomllib/YAML output before validation
def load_file(path: str | Path) -> dict[str, Any]:
    """A ``--config`` file's settings by flat name."""
    return _sources.load_file(path, SETTINGS)


def from_env(env: Mapping[str, str] | None = None) -> dict[str, str | list[str]]:
    """The ``STALWART_<NAME>`` settings of ``env`` (default: this process's) by flat name."""
    return _sources.from_env(os.environ if env is None else env, SETTINGS)


def build(
    flags: Mapping[str, object], *, config_file: str | None = None, env: Mapping[str, str] | None = None
) -> RunConfig:
    """The run's settings: defaults < ``config_file`` < ``env`` < ``flags`` (flat names; a flag of
    None was not given)."""
    try:
        layers = RunConfig.sources(flags, config_file, env)
        cfg = RunConfig(_build_sources=(layers, {}))  # type: ignore[call-arg]  # BaseSettings' own argument
        return cfg.resolved()
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = _sources.flat_name(tuple(err["loc"]), SETTINGS) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"invalid setting {loc}: {msg}" if loc != "config" else msg) from None
