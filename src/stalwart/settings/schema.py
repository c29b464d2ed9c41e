"""The settings of ``stalwart run``, one nested model per concern.

Each leaf field carries, in its ``Annotated`` metadata, a :class:`Setting`: the flat setting name
(the key in a ``--config`` file and the ``STALWART_<NAME>`` variable) and the command-line flags,
torchrun's spellings included. The field's ``description`` is the flag's help and its default the
flag's default, so the command line (``commands/run.py``), the file and environment readers
(``settings/sources.py``) and the simulator (``sim/config.py`` embeds :class:`HangSettings`) all derive
from these classes; nothing here is written twice.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_serializer, field_validator

from ..account.mfu import MODEL_SPEC_HELP, parse_model_spec
from ..errors import ConfigError
from ..policy.checkpoint_scrub import DEFAULT_DUTY
from ..policy.timeouts import (
    CPU_STALL_S,
    HANG_CAP_S,
    HANG_FLOOR_S,
    HANG_MIN_SAMPLES,
    HANG_MULTIPLIER,
    STARTUP_TIMEOUT_S,
    STORE_TIMEOUT_S,
    HangTimeoutPolicy,
)
from ..protocol import DEFAULT_PG_TIMEOUT_S
from ..secret_values import read_url_file, redact_url
from .panels import Panel
from .streams import parse_streams


@dataclass(frozen=True)
class Setting:
    """Where a field is set from: its flat name (file key, ``STALWART_<NAME>``) and its flags.

    No flags: file and environment only. ``cli_type`` is what the flag takes when it differs from
    the field (``--nproc-per-node auto`` becomes a number); ``argument``: a positional argument;
    ``panel``: its help heading when not its group's; ``sdk``: acts only for scripts using the SDK."""

    name: str
    flags: tuple[str, ...] = ()
    cli_type: type | None = None
    metavar: str | None = None
    argument: bool = False
    panel: Panel | None = None
    sdk: bool = False


def setting(name: str, *flags: str, **kw) -> Setting:
    return Setting(name, tuple(flags), **kw)


_MODEL = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
MODEL_CONFIG = _MODEL  # for the settings models declared beside this module (settings_recovery.py)


class HangSettings(BaseModel):
    """Hang detection and the timeouts it must stay below (policy/timeouts.py)."""

    model_config = _MODEL

    multiplier: Annotated[float, setting("hang_multiplier", "--hang-multiplier")] = Field(
        default=HANG_MULTIPLIER, gt=0, description="Hang timeout = this x p99 step time."
    )
    floor_s: Annotated[float, setting("hang_floor_s", "--hang-floor")] = Field(
        default=HANG_FLOOR_S, gt=0, description="Smallest hang timeout, seconds."
    )
    cap_s: Annotated[float, setting("hang_cap_s", "--hang-cap")] = Field(
        default=HANG_CAP_S, gt=0, description="Largest hang timeout, seconds."
    )
    startup_s: Annotated[float, setting("startup_timeout_s", "--startup-timeout", sdk=True)] = Field(
        default=STARTUP_TIMEOUT_S,
        gt=0,
        description="Hang timeout of workers before their first step, seconds.",
    )
    min_samples: Annotated[int, setting("hang_min_samples", "--hang-min-samples")] = Field(
        default=HANG_MIN_SAMPLES, ge=1, description="Steps seen before calibrating."
    )
    pg_timeout_s: Annotated[float, setting("pg_timeout_s", "--pg-timeout")] = Field(
        default=DEFAULT_PG_TIMEOUT_S, gt=0, description="Process-group timeout given to workers, seconds."
    )
    cpu_stall_s: Annotated[float, setting("cpu_stall_s", "--cpu-stall")] = Field(
        default=CPU_STALL_S,
        ge=0,
        description="Hang timeout of workers never reported by a hook or the SDK: seconds of no CPU "
        "progress on every rank (a stopped rank: the hang floor); 0: the process-group timeout.",
    )
    slow_link_kbit: Annotated[float, setting("slow_link_kbit", "--slow-link-kbit")] = Field(
        default=64.0,
        ge=0,
        description="A rank silent past its hang timeout while its connections move "
        "this many kbit/s is on a slow link, not hung (up to --pg-timeout); 0: off.",
    )

    @property
    def policy(self) -> HangTimeoutPolicy:
        return HangTimeoutPolicy(self.multiplier, self.floor_s, self.cap_s, self.startup_s, self.min_samples)


class RendezvousSettings(BaseModel):
    """How the agents meet: torchrun's static or c10d rendezvous (or Stalwart's own on its store)."""

    model_config = _MODEL

    backend: Annotated[str, setting("rdzv_backend", "--rdzv-backend", "--rdzv_backend")] = Field(
        default="",
        description="static, c10d (one host's store), stalwart (Stalwart's own rendezvous on the same "
        "store: a small signed key per node and round, no keep-alive writes) or etcd (an etcd cluster; "
        "etcd-v2 is the same); unset: c10d when --rdzv-endpoint is given, else static.",
    )
    endpoint: Annotated[str, setting("rdzv_endpoint", "--rdzv-endpoint", "--rdzv_endpoint")] = Field(
        default="",
        description="HOST:PORT of the c10d (or stalwart) rendezvous; etcd: its members' HOST:PORT, comma-separated.",
    )
    id: Annotated[str, setting("rdzv_id", "--rdzv-id", "--rdzv_id")] = Field(
        default="", description="Job id shared by all agents."
    )
    conf: Annotated[str, setting("rdzv_conf", "--rdzv-conf", "--rdzv_conf")] = Field(
        default="",
        description="Comma-separated key=value pairs (join_timeout, last_call_timeout, is_host and others).",
    )
    standalone: Annotated[bool, setting("standalone", "--standalone")] = Field(
        default=False, description="Single node, local rendezvous."
    )
    timeout_s: Annotated[float, setting("rdzv_timeout_s", "--rdzv-timeout", panel=Panel.MULTI_NODE)] = Field(
        default=900.0, gt=0, description="Seconds to wait for a rendezvous."
    )
    last_call_s: Annotated[float, setting("rdzv_last_call_s")] = Field(
        default=3.0, ge=0, description="Seconds a rendezvous waits for late agents once the minimum is there."
    )
    startup_window_s: Annotated[
        float, setting("rdzv_startup_window_s", "--rdzv-startup-window", panel=Panel.MULTI_NODE)
    ] = Field(
        default=30.0,
        ge=0,
        description="First round only: seconds an agent waits for every host of --nnodes MAX to arrive "
        "before it joins (hosts that start apart still form attempt 0 together); ends at once when they "
        "are all there, so it costs time only when fewer start. 0: off. --rdzv-conf startup_window.",
    )
    keepalive_s: Annotated[float, setting("rdzv_keepalive_s")] = Field(
        default=1.0, gt=0, description="Seconds between an agent's keep-alive beats."
    )
    store_timeout_s: Annotated[float, setting("rdzv_read_timeout_s")] = Field(
        default=STORE_TIMEOUT_S,
        gt=0,
        description="Seconds the rendezvous store may leave this agent's reads unanswered before the job "
        "ends (exit 75); --rdzv-conf read_timeout sets it.",
    )
    host: Annotated[
        bool | None, setting("rdzv_host", "--rdzv-host/--no-rdzv-host", panel=Panel.MULTI_NODE)
    ] = Field(
        default=None, description="Host the rendezvous store here (default: when the endpoint is local)."
    )
    node_rank: Annotated[int, setting("node_rank", "--node-rank", "--node_rank")] = Field(
        default=0, ge=0, description="This node's rank (static rendezvous)."
    )
    master_addr: Annotated[str, setting("master_addr", "--master-addr", "--master_addr")] = Field(
        default="", description="Rank 0's address (static)."
    )
    master_port: Annotated[int, setting("master_port", "--master-port", "--master_port")] = Field(
        default=0, ge=0, le=65535, description="Rank 0's port (static); 0: a free port per attempt."
    )
    local_addr: Annotated[str, setting("local_addr", "--local-addr", "--local_addr")] = Field(
        default="", description="Address other nodes reach this one on."
    )

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in ("", "static", "c10d", "stalwart", "etcd", "etcd-v2"):
            raise ValueError(f"--rdzv-backend {v!r} is not supported: use static, c10d, stalwart or etcd")
        return v


class RestartSettings(BaseModel):
    """The restart budget (policy/restart_policy.py)."""

    model_config = _MODEL

    max_restarts: Annotated[
        int, setting("max_restarts", "--max-restarts", "--max_restarts", panel=Panel.TORCHRUN)
    ] = Field(default=3, ge=0, description="Restarts allowed for infrastructure faults.")
    max_user_error_restarts: Annotated[
        int, setting("max_user_error_restarts", "--max-user-error-restarts")
    ] = Field(default=1, ge=0, description="Restarts allowed after exceptions in the script.")
    backoff_base_s: Annotated[float, setting("backoff_base_s", "--backoff")] = Field(
        default=1.0, ge=0, description="Base backoff between failed restarts, seconds."
    )
    backoff_max_s: Annotated[float, setting("backoff_max_s")] = Field(
        default=30.0, ge=0, description="Longest backoff between failed restarts, seconds."
    )


class WorkerSettings(BaseModel):
    """How worker processes are started, signalled and stopped."""

    model_config = _MODEL

    role: Annotated[str, setting("role", "--role")] = Field(
        default="default", description="Worker role (ROLE_NAME)."
    )
    start_method: Annotated[str, setting("start_method", "--start-method", "--start_method")] = Field(
        default="spawn", description="spawn, fork or forkserver (workers are always fresh processes)."
    )
    virtual_local_rank: Annotated[
        bool, setting("virtual_local_rank", "--virtual-local-rank", "--virtual_local_rank")
    ] = Field(default=False, description="LOCAL_RANK=0 for every worker, one visible GPU each.")
    numa_binding: Annotated[str, setting("numa_binding", "--numa-binding", "--numa_binding")] = Field(
        default="", description="Accepted (node, socket, exclusive, core-complex); no effect without GPUs."
    )
    signals_to_handle: Annotated[
        str, setting("signals_to_handle", "--signals-to-handle", "--signals_to_handle")
    ] = Field(default="SIGTERM,SIGINT,SIGHUP,SIGQUIT", description="Signals the agent handles.")
    stop_grace_s: Annotated[
        float, setting("stop_grace_s", "--stop-grace", "--shutdown-timeout", "--shutdown_timeout")
    ] = Field(default=3.0, gt=0, description="SIGTERM -> SIGKILL grace when stopping workers, seconds.")
    warm: Annotated[bool, setting("warm", "--warm/--no-warm", panel=Panel.RECOVERY)] = Field(
        default=True,
        description="Start workers from a fork server with torch preloaded; see docs/fast-recovery.md.",
    )
    instrument: Annotated[
        bool, setting("instrument", "--instrument/--no-instrument", panel=Panel.ADVANCED)
    ] = Field(
        default=True, description="Start workers through the bootstrap: step hooks, stacks, process titles."
    )
    warm_fail_attempt: Annotated[int, setting("warm_fail_attempt")] = Field(
        default=-1, ge=-1, description="The attempt whose warm start is forced to fail (testing); -1: none."
    )

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

    @field_validator("signals_to_handle")
    @classmethod
    def _signals(cls, v: str) -> str:
        for name in (x.strip() for x in v.split(",") if x.strip()):
            if not hasattr(signal, name) or not name.startswith("SIG"):
                raise ValueError(f"--signals-to-handle: unknown signal {name!r} (e.g. SIGTERM,SIGUSR1)")
        return v


class LogSettings(BaseModel):
    """Where the workers' output goes (launch/output.py), and torchrun's accepted log flags."""

    model_config = _MODEL

    log_dir: Annotated[Path | None, setting("log_dir", "--log-dir", "--log_dir")] = Field(
        default=None, description="Base directory for redirected/teed logs."
    )
    redirects: Annotated[str, setting("redirects", "-r", "--redirects")] = Field(
        default="0", description="Streams to files only: 0-3, or LOCAL:0-3 pairs joined by commas."
    )
    tee: Annotated[str, setting("tee", "-t", "--tee")] = Field(
        default="0", description="Streams to files and console: 0-3, or LOCAL:0-3 pairs joined by commas."
    )
    local_ranks_filter: Annotated[
        str, setting("local_ranks_filter", "--local-ranks-filter", "--local_ranks_filter")
    ] = Field(default="", description="Show only these local ranks on the console, e.g. 0,1.")
    duplicate_stdout_filters: Annotated[
        str,
        setting(
            "duplicate_stdout_filters",
            "--duplicate-stdout-filters",
            "--duplicate_stdout_filters",
            metavar="FILTERS",
        ),
    ] = Field(default="", description="Accepted for compatibility (not used).")
    duplicate_stderr_filters: Annotated[
        str,
        setting(
            "duplicate_stderr_filters",
            "--duplicate-stderr-filters",
            "--duplicate_stderr_filters",
            metavar="FILTERS",
        ),
    ] = Field(default="", description="Accepted for compatibility (not used).")
    event_log_handler: Annotated[
        str, setting("event_log_handler", "--event-log-handler", "--event_log_handler")
    ] = Field(default="null", description="Accepted; Stalwart's events go to its ledger.")
    logs_specs: Annotated[str, setting("logs_specs", "--logs-specs", "--logs_specs")] = Field(
        default="", description="Accepted; Stalwart writes the logs itself."
    )

    @field_validator("redirects", "tee", mode="before")
    @classmethod
    def _streams(cls, v: str, info: ValidationInfo) -> str:
        parse_streams(str(v), 1, flag=f"--{info.field_name}")  # raises ValueError with the flag's name
        return str(v)

    @field_validator("local_ranks_filter")
    @classmethod
    def _ranks_filter(cls, v: str) -> str:
        if v and not all(x.strip().isdigit() for x in v.split(",")):
            raise ValueError(f"--local-ranks-filter {v!r} must be local ranks separated by commas, e.g. 0,1")
        return v


class CheckpointSettings(BaseModel):
    """What the agent asks of the workers' checkpoints."""

    model_config = _MODEL

    emergency_deadline_s: Annotated[float, setting("emergency_deadline_s", "--emergency-deadline")] = Field(
        default=30.0, gt=0, description="Seconds allowed for the emergency checkpoint on SIGTERM/SIGUSR1."
    )
    scrub_duty: Annotated[float, setting("checkpoint_scrub_duty", "--checkpoint-scrub-duty")] = Field(
        default=DEFAULT_DUTY,
        ge=0,
        le=1,
        description="Share of one CPU the agent may spend re-verifying committed checkpoints in the "
        "background, setting damaged ones aside before a recovery needs them (0: off).",
    )


class ChaosSettings(BaseModel):
    """Faults injected into this run (chaos/)."""

    model_config = _MODEL

    specs: Annotated[list[str], setting("chaos", "--chaos")] = Field(
        default_factory=list, description="Fault to inject, e.g. crash@rank=1,step=40 (repeatable)."
    )
    file: Annotated[str, setting("chaos_file", "--chaos-file")] = Field(
        default="", description="YAML fault plan."
    )


class HealthSettings(BaseModel):
    """This node's health gate (health/)."""

    model_config = _MODEL

    gate: Annotated[bool, setting("health_gate", "--health-gate/--no-health-gate")] = Field(
        default=True, description="Check this node before the first start and every restart."
    )
    fixture: Annotated[Path | None, setting("health_fixture", "--health-fixture", panel=Panel.CHAOS)] = Field(
        default=None, description="Recorded telemetry to check instead of the live node (testing)."
    )
    active: Annotated[bool, setting("health_active", "--health-active/--no-health-active")] = Field(
        default=False, description="Run the active suite (GEMM, bandwidth, disk) before restarts."
    )
    backend: Annotated[str, setting("health_backend", "--health-backend")] = Field(
        default="local", description="Where drains go: local or slurm."
    )
    state_dir: Annotated[Path | None, setting("health_state_dir", "--health-state-dir")] = Field(
        default=None, description="Node records shared across runs (default RUN_DIR/health)."
    )

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in ("local", "slurm"):
            raise ValueError(f"--health-backend {v!r} must be local or slurm")
        return v


class ObserveSettings(BaseModel):
    """This run's Prometheus exporter and notification targets (serve/)."""

    model_config = _MODEL

    metrics_port: Annotated[int | None, setting("metrics_port", "--metrics-port")] = Field(
        default=None, ge=0, le=65535, description="Serve Prometheus /metrics on this port (0 = any)."
    )
    metrics_addr: Annotated[str, setting("metrics_addr", "--metrics-addr")] = Field(
        default="127.0.0.1", description="Address for --metrics-port."
    )
    metrics_model: Annotated[str, setting("metrics_model", "--metrics-model")] = Field(
        default="",
        description=f"Model spec for tokens/s and MFU on /metrics, {MODEL_SPEC_HELP}.",
    )
    notify: Annotated[list[str], setting("notify", "--notify")] = Field(
        default_factory=list,
        description="Post interruptions and the verdict to this Slack-compatible URL "
        "(generic:URL for plain JSON; repeatable; a secret: prefer STALWART_NOTIFY or --notify-file).",
    )
    notify_file: Annotated[Path | None, setting("notify_file", "--notify-file")] = Field(
        default=None,
        description="File (mode 0600) with one --notify URL per line, kept off the command line.",
    )

    @field_serializer("notify", when_used="json")
    def _redacted(self, v: list[str]) -> list[str]:
        """What the ledger and every JSON dump keep of a webhook URL: its scheme and host."""
        return [redact_url(u) for u in v]

    def notify_urls(self) -> list[str]:
        """Every notification URL: ``--notify``/``STALWART_NOTIFY`` and the ``--notify-file``'s."""
        return [*self.notify, *(read_url_file(self.notify_file, "--notify") if self.notify_file else [])]

    @field_validator("metrics_model")
    @classmethod
    def _model_spec(cls, v: str) -> str:
        if v:
            try:
                parse_model_spec(v)
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("--model: ")) from None
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


class DiagnosisSettings(BaseModel):
    """Live diagnosis (diagnose/live.py): where this node's evidence comes from."""

    model_config = _MODEL

    topology: Annotated[Path | None, setting("topology", "--topology")] = Field(
        default=None, description="Node -> rack, leaf switch, PDU, cooling loop (YAML or CSV) for diagnosis."
    )
    facility: Annotated[str, setting("facility", "--facility")] = Field(
        default="", description="Facility telemetry: a CSV/JSON file or a Prometheus URL (diagnosis)."
    )
    facility_query: Annotated[list[str], setting("facility_query", "--facility-query")] = Field(
        default_factory=list,
        description="metric=PromQL for --facility URL, e.g. inlet_temp_c=cdu_inlet_c.",
    )
    kernel_log: Annotated[Path | None, setting("kernel_log", "--kernel-log")] = Field(
        default=None, description="Kernel log file (dmesg lines) read for Xids during the run."
    )
    node_telemetry: Annotated[Path | None, setting("node_telemetry", "--node-telemetry")] = Field(
        default=None, description="Directory of node telemetry in the health fixture format (diagnosis)."
    )
    interval_s: Annotated[float, setting("diagnose_interval_s", "--diagnose-interval")] = Field(
        default=2.0, ge=0, description="Seconds between live diagnosis rounds (0 = off)."
    )

    @property
    def configured(self) -> bool:
        """Whether an evidence source is given (the run checks them before it starts)."""
        return bool(
            self.topology or self.facility or self.facility_query or self.kernel_log or self.node_telemetry
        )
