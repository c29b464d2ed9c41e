"""``stalwart run``: a torchrun-compatible launcher that keeps the job going."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import typer

from ..errors import ConfigError


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_interspersed_args": False})
    def run(
        script: str = typer.Argument(
            ..., help="Training script (or module with -m) followed by its arguments."
        ),
        script_args: list[str] = typer.Argument(None, help="Arguments passed to the script."),
        # --- torchrun's flags: same names, spellings, values and meaning ------------------------
        nnodes: str = typer.Option(None, "--nnodes", help="Nodes: N or MIN:MAX (elastic)."),
        nproc_per_node: str = typer.Option(
            None, "--nproc-per-node", "--nproc_per_node", help="Workers per node: N, auto, cpu, gpu or xpu."
        ),
        rdzv_backend: str = typer.Option(
            None,
            "--rdzv-backend",
            "--rdzv_backend",
            help="static (default) or c10d (default when --rdzv-endpoint is given).",
        ),
        rdzv_endpoint: str = typer.Option(
            None, "--rdzv-endpoint", "--rdzv_endpoint", help="HOST:PORT of the c10d rendezvous."
        ),
        rdzv_id: str = typer.Option(None, "--rdzv-id", "--rdzv_id", help="Job id shared by all agents."),
        rdzv_conf: str = typer.Option(
            None,
            "--rdzv-conf",
            "--rdzv_conf",
            help="Comma-separated key=value pairs (join_timeout, last_call_timeout, is_host and others).",
        ),
        standalone: bool = typer.Option(None, "--standalone", help="Single node, local rendezvous."),
        max_restarts: int = typer.Option(
            None,
            "--max-restarts",
            "--max_restarts",
            help="Restarts allowed for infrastructure faults (default 3).",
        ),
        monitor_interval: float = typer.Option(
            None, "--monitor-interval", "--monitor_interval", help="Agent poll interval, seconds (0.05)."
        ),
        start_method: str = typer.Option(
            None,
            "--start-method",
            "--start_method",
            help="spawn, fork or forkserver (workers are always fresh processes).",
        ),
        event_log_handler: str = typer.Option(
            None,
            "--event-log-handler",
            "--event_log_handler",
            help="Accepted; Stalwart's events go to its ledger.",
        ),
        role: str = typer.Option(None, "--role", help="Worker role (ROLE_NAME), default 'default'."),
        module: bool = typer.Option(None, "-m", "--module", help="Run SCRIPT as a module (python -m)."),
        no_python: bool = typer.Option(None, "--no-python", "--no_python", help="Execute SCRIPT directly."),
        run_path: bool = typer.Option(
            None, "--run-path", "--run_path", help="Run SCRIPT (absolute path) via runpy."
        ),
        log_dir: Path = typer.Option(
            None, "--log-dir", "--log_dir", help="Base directory for redirected/teed logs."
        ),
        redirects: str = typer.Option(
            None, "-r", "--redirects", help="Streams to files only: 0-3, or LOCAL:0-3 pairs joined by commas."
        ),
        tee: str = typer.Option(
            None,
            "-t",
            "--tee",
            help="Streams to files and console: 0-3, or LOCAL:0-3 pairs joined by commas.",
        ),
        local_ranks_filter: str = typer.Option(
            None,
            "--local-ranks-filter",
            "--local_ranks_filter",
            help="Show only these local ranks on the console, e.g. 0,1.",
        ),
        duplicate_stdout_filters: str = typer.Option(
            None,
            "--duplicate-stdout-filters",
            "--duplicate_stdout_filters",
            metavar="FILTERS",
            help="Accepted for compatibility (not used).",
        ),
        duplicate_stderr_filters: str = typer.Option(
            None,
            "--duplicate-stderr-filters",
            "--duplicate_stderr_filters",
            metavar="FILTERS",
            help="Accepted for compatibility (not used).",
        ),
        node_rank: int = typer.Option(
            None, "--node-rank", "--node_rank", help="This node's rank (static rendezvous)."
        ),
        master_addr: str = typer.Option(
            None, "--master-addr", "--master_addr", help="Rank 0's address (static)."
        ),
        master_port: int = typer.Option(
            None, "--master-port", "--master_port", help="Rank 0's port (static)."
        ),
        local_addr: str = typer.Option(
            None, "--local-addr", "--local_addr", help="Address other nodes reach this one on."
        ),
        logs_specs: str = typer.Option(
            None, "--logs-specs", "--logs_specs", help="Accepted; Stalwart writes the logs itself."
        ),
        numa_binding: str = typer.Option(
            None,
            "--numa-binding",
            "--numa_binding",
            help="Accepted (node, socket, exclusive, core-complex); no effect without GPUs.",
        ),
        signals_to_handle: str = typer.Option(
            None,
            "--signals-to-handle",
            "--signals_to_handle",
            help="Signals the agent handles (default SIGTERM,SIGINT,SIGHUP,SIGQUIT).",
        ),
        shutdown_timeout: float = typer.Option(
            None,
            "--shutdown-timeout",
            "--shutdown_timeout",
            help="SIGTERM -> SIGKILL grace when stopping workers.",
        ),
        virtual_local_rank: bool = typer.Option(
            None,
            "--virtual-local-rank",
            "--virtual_local_rank",
            help="LOCAL_RANK=0 for every worker, one visible GPU each.",
        ),
        # --- Stalwart's additions --------------------------------------------------------------
        max_user_error_restarts: int = typer.Option(
            None,
            "--max-user-error-restarts",
            help="Restarts allowed after exceptions in the script (default 1).",
        ),
        rdzv_timeout: float = typer.Option(None, "--rdzv-timeout", help="Seconds to wait for a rendezvous."),
        rdzv_host: bool = typer.Option(
            None,
            "--rdzv-host/--no-rdzv-host",
            help="Host the rendezvous store here (default: when the endpoint is local).",
        ),
        node_name: str = typer.Option(
            None, "--node-name", help="Name of this node in the ledger (default hostname)."
        ),
        run_dir: Path = typer.Option(None, "--run-dir", help="Where ledger, checkpoints and logs go."),
        run_id: str = typer.Option(
            None, "--run-id", help="Run id (default: Slurm job id, --rdzv-id, or a hash of the command line)."
        ),
        hang_floor: float = typer.Option(
            None, "--hang-floor", help="Smallest hang timeout, seconds (default 10)."
        ),
        hang_cap: float = typer.Option(
            None, "--hang-cap", help="Largest hang timeout, seconds (default 300)."
        ),
        hang_multiplier: float = typer.Option(
            None, "--hang-multiplier", help="Hang timeout = this x p99 step time (3)."
        ),
        hang_min_samples: int = typer.Option(
            None, "--hang-min-samples", help="Steps seen before calibrating (5)."
        ),
        startup_timeout: float = typer.Option(
            None, "--startup-timeout", help="Hang timeout of SDK workers before steps are seen (300)."
        ),
        cpu_stall: float = typer.Option(
            None, "--cpu-stall", help="Hang timeout without the SDK: seconds with no CPU progress (30)."
        ),
        pg_timeout: float = typer.Option(
            None, "--pg-timeout", help="Process-group timeout given to workers (600)."
        ),
        stop_grace: float = typer.Option(None, "--stop-grace", help="Same as --shutdown-timeout."),
        emergency_deadline: float = typer.Option(
            None,
            "--emergency-deadline",
            help="Seconds allowed for the emergency checkpoint on SIGTERM/SIGUSR1.",
        ),
        backoff: float = typer.Option(
            None, "--backoff", help="Base backoff between failed restarts, seconds."
        ),
        chaos: list[str] = typer.Option(
            None, "--chaos", help="Fault to inject, e.g. crash@rank=1,step=40 (repeatable)."
        ),
        chaos_file: str = typer.Option(None, "--chaos-file", help="YAML fault plan."),
        health_gate: bool = typer.Option(
            None,
            "--health-gate/--no-health-gate",
            help="Check this node before the first start and every restart (default on).",
        ),
        warm: bool = typer.Option(
            None,
            "--warm/--no-warm",
            help="Start workers from a fork server with torch preloaded (default on); see docs/fast-recovery.md.",
        ),
        health_fixture: Path = typer.Option(
            None, "--health-fixture", help="Recorded telemetry to check instead of the live node (testing)."
        ),
        health_active: bool = typer.Option(
            None,
            "--health-active/--no-health-active",
            help="Run the active suite (GEMM, bandwidth, disk) before restarts.",
        ),
        health_backend: str = typer.Option(None, "--health-backend", help="Where drains go: local or slurm."),
        health_state_dir: Path = typer.Option(
            None, "--health-state-dir", help="Node records shared across runs (default RUN_DIR/health)."
        ),
        valid_sizes: str = typer.Option(
            None,
            "--valid-sizes",
            help="Valid world sizes: any, pow2 or multiple:N; extra nodes are hot spares.",
        ),
        config: str = typer.Option(None, "--config", help="YAML/TOML file of these settings."),
        quiet: bool = typer.Option(None, "--quiet", "-q", help="Print only the verdict."),
        report: bool = typer.Option(
            True, "--report/--no-report", help="Print the goodput report at the end."
        ),
        metrics_port: int = typer.Option(
            None, "--metrics-port", help="Serve Prometheus /metrics on this port (0 = any)."
        ),
        metrics_addr: str = typer.Option(
            None, "--metrics-addr", help="Address for --metrics-port (default 127.0.0.1)."
        ),
        metrics_model: str = typer.Option(
            None,
            "--metrics-model",
            help="Model spec for tokens/s and MFU on /metrics: params=7e9,layers=32,heads=32,"
            "head_dim=128,seq_len=4096,tokens_per_step=4e6,gpus=64,device=h100[,dtype=bf16].",
        ),
        topology: Path = typer.Option(
            None,
            "--topology",
            help="Node -> rack, leaf switch, PDU, cooling loop (YAML or CSV) for diagnosis.",
        ),
        facility: str = typer.Option(
            None, "--facility", help="Facility telemetry: a CSV/JSON file or a Prometheus URL (diagnosis)."
        ),
        facility_query: list[str] = typer.Option(
            None, "--facility-query", help="metric=PromQL for --facility URL, e.g. inlet_temp_c=cdu_inlet_c."
        ),
        kernel_log: Path = typer.Option(
            None, "--kernel-log", help="Kernel log file (dmesg lines) read for Xids during the run."
        ),
        node_telemetry: Path = typer.Option(
            None,
            "--node-telemetry",
            help="Directory of node telemetry in the health fixture format (diagnosis).",
        ),
        diagnose_interval: float = typer.Option(
            None, "--diagnose-interval", help="Seconds between live diagnosis rounds (default 2; 0 = off)."
        ),
        straggler_action: str = typer.Option(
            None,
            "--straggler-action",
            help="observe (default): record the straggler policy's verdicts; auto: act once the detector's "
            "measured precision passes; act: exclude a costly straggler's node unless measured precision fails.",
        ),
        straggler_min_precision: float = typer.Option(
            None, "--straggler-min-precision", help="Precision the straggler detector needs to act (0.9)."
        ),
        straggler_history: Path = typer.Option(
            None,
            "--straggler-history",
            help="Run dir or ledger whose straggler firings add to the measured precision.",
        ),
        straggler_recovery: float = typer.Option(
            None,
            "--straggler-recovery",
            help="Seconds a restart without the straggler's node costs, restart to first step (300).",
        ),
        notify: list[str] = typer.Option(
            None,
            "--notify",
            help="Post interruptions and the verdict to this Slack-compatible URL (generic:URL for plain JSON; repeatable).",
        ),
    ) -> int:
        """Launch and supervise training workers; restart through crashes and hangs."""
        from ..launch import config as run_config
        from ..launch.torchrun_flags import pet_defaults, resolve_nproc

        flags = {
            "script": script,
            "script_args": list(script_args or []),
            "module": module,
            "nproc_per_node": nproc_per_node,
            "nnodes": nnodes,
            "max_restarts": max_restarts,
            "rdzv_backend": rdzv_backend,
            "rdzv_conf": rdzv_conf,
            "standalone": standalone,
            "start_method": start_method,
            "event_log_handler": event_log_handler,
            "role": role,
            "no_python": no_python,
            "run_path": run_path,
            "log_dir": log_dir,
            "redirects": redirects,
            "tee": tee,
            "local_ranks_filter": local_ranks_filter,
            "duplicate_stdout_filters": duplicate_stdout_filters,
            "duplicate_stderr_filters": duplicate_stderr_filters,
            "node_rank": node_rank,
            "master_addr": master_addr,
            "master_port": master_port,
            "logs_specs": logs_specs,
            "numa_binding": numa_binding,
            "signals_to_handle": signals_to_handle,
            "virtual_local_rank": virtual_local_rank,
            "max_user_error_restarts": max_user_error_restarts,
            "rdzv_endpoint": rdzv_endpoint,
            "rdzv_id": rdzv_id,
            "rdzv_timeout_s": rdzv_timeout,
            "rdzv_host": rdzv_host,
            "local_addr": local_addr,
            "node_name": node_name,
            "run_dir": run_dir,
            "run_id": run_id,
            "hang_floor_s": hang_floor,
            "hang_cap_s": hang_cap,
            "hang_multiplier": hang_multiplier,
            "hang_min_samples": hang_min_samples,
            "startup_timeout_s": startup_timeout,
            "cpu_stall_s": cpu_stall,
            "pg_timeout_s": pg_timeout,
            "monitor_interval_s": monitor_interval,
            "stop_grace_s": stop_grace if stop_grace is not None else shutdown_timeout,
            "emergency_deadline_s": emergency_deadline,
            "backoff_base_s": backoff,
            "chaos": chaos or None,
            "chaos_file": chaos_file,
            "quiet": quiet,
            "health_gate": health_gate,
            "warm": warm,
            "health_fixture": health_fixture,
            "health_active": health_active,
            "health_backend": health_backend,
            "valid_sizes": valid_sizes,
            "health_state_dir": health_state_dir,
            "metrics_port": metrics_port,
            "metrics_addr": metrics_addr,
            "metrics_model": metrics_model,
            "notify": notify or None,
            "topology": topology,
            "facility": facility,
            "facility_query": facility_query or None,
            "kernel_log": kernel_log,
            "node_telemetry": node_telemetry,
            "diagnose_interval_s": diagnose_interval,
            "straggler_action": straggler_action,
            "straggler_act_min_precision": straggler_min_precision,
            "straggler_history": straggler_history,
            "straggler_recovery_s": straggler_recovery,
        }
        for key, value in pet_defaults(os.environ).items():  # torchrun's PET_* variables: defaults for flags
            if flags.get(key) is None:
                flags[key] = value
        if flags.get("nproc_per_node") is not None:
            flags["nproc_per_node"] = resolve_nproc(str(flags["nproc_per_node"]))
        flags.update(run_config.parse_rdzv_conf(flags.get("rdzv_conf") or ""))
        if not (flags.get("module") or flags.get("no_python")) and not Path(script).is_file():
            raise ConfigError(
                f"training script {script!r} not found", "give a path to a .py file, or use -m for a module"
            )
        if chaos_file and not Path(chaos_file).is_file():
            raise ConfigError(f"fault plan {chaos_file!r} not found")
        cfg = run_config.build(flags, config_file=config)
        if cfg.module and not cfg.no_python:
            import importlib.util

            try:
                found = importlib.util.find_spec(script)
            except (ImportError, ValueError):
                found = None
            if found is None:
                raise ConfigError(
                    f"module {script!r} not found", "check -m NAME and the Python path (PYTHONPATH)"
                )
        execute(cfg, report=report)


def execute(cfg, *, report: bool, intro: list[str] | None = None) -> None:
    """Run the agent with live console output; optionally print the report; exit with the verdict's code."""
    from ..launch.agent import Agent
    from ..launch.config import claim_run_dir
    from ..launch.console import RunConsole
    from ..process_clock import process_start

    if shutil.which(cfg.python) is None and not Path(cfg.python).exists():
        raise ConfigError(f"python interpreter {cfg.python!r} not found")
    claim_run_dir(cfg)
    console = RunConsole(quiet=cfg.quiet)
    for line in intro or ():
        console.say(line)
    from ..serve.attach import Observability  # exporter + notifier; no-ops without --metrics-port/--notify

    observe = Observability.from_config(cfg, say=console.say)
    agent = Agent(
        cfg,
        notify=observe.chain(console.event),
        progress=console.progress,
        started=process_start(),  # the process start, read from /proc
        note=console.note,
    )
    console.say(f"run dir: {cfg.run_dir}")
    observe.start()
    try:
        code = agent.run_job()
    finally:
        observe.stop()
        console.close()
    if report:
        from ..account.report import print_report

        print()
        print_report(cfg.run_dir)
    # The ledger is closed and the verdict printed: skip interpreter teardown (torch's
    # finalizers take seconds on a loaded machine), so the job ends when its ledger says.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
