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
        module: bool = typer.Option(None, "-m", "--module", help="Run SCRIPT as a module (python -m)."),
        nproc_per_node: int = typer.Option(
            None, "--nproc-per-node", "--nproc_per_node", help="Workers per node."
        ),
        nnodes: str = typer.Option(None, "--nnodes", help="Nodes: N or MIN:MAX (elastic)."),
        max_restarts: int = typer.Option(
            None,
            "--max-restarts",
            "--max_restarts",
            help="Restarts allowed for infrastructure faults (default 3).",
        ),
        max_user_error_restarts: int = typer.Option(
            None,
            "--max-user-error-restarts",
            help="Restarts allowed after exceptions in the script (default 1).",
        ),
        rdzv_endpoint: str = typer.Option(
            None, "--rdzv-endpoint", "--rdzv_endpoint", help="HOST:PORT of the c10d rendezvous."
        ),
        rdzv_id: str = typer.Option(None, "--rdzv-id", "--rdzv_id", help="Job id shared by all agents."),
        rdzv_timeout: float = typer.Option(None, "--rdzv-timeout", help="Seconds to wait for a rendezvous."),
        rdzv_host: bool = typer.Option(
            None,
            "--rdzv-host/--no-rdzv-host",
            help="Host the rendezvous store here (default: when the endpoint is local).",
        ),
        local_addr: str = typer.Option(None, "--local-addr", help="Address other nodes reach this one on."),
        node_name: str = typer.Option(
            None, "--node-name", help="Name of this node in the ledger (default hostname)."
        ),
        run_dir: Path = typer.Option(None, "--run-dir", help="Where ledger, checkpoints and logs go."),
        run_id: str = typer.Option(None, "--run-id", help="Run id (default: the rdzv id or a new one)."),
        hang_floor: float = typer.Option(
            None, "--hang-floor", help="Smallest hang timeout, seconds (default 10)."
        ),
        hang_cap: float = typer.Option(
            None, "--hang-cap", help="Largest hang timeout, seconds (default 300)."
        ),
        hang_multiplier: float = typer.Option(
            None, "--hang-multiplier", help="Hang timeout = this x p99 step time (3)."
        ),
        startup_timeout: float = typer.Option(
            None, "--startup-timeout", help="Hang timeout before steps are seen (300)."
        ),
        pg_timeout: float = typer.Option(
            None, "--pg-timeout", help="Process-group timeout given to workers (600)."
        ),
        monitor_interval: float = typer.Option(
            None, "--monitor-interval", help="Agent poll interval, seconds (0.05)."
        ),
        stop_grace: float = typer.Option(
            None, "--stop-grace", help="SIGTERM -> SIGKILL grace when stopping workers."
        ),
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
        tee: bool = typer.Option(
            None, "--tee/--no-tee", help="Show worker output instead of logging it to files."
        ),
        quiet: bool = typer.Option(None, "--quiet", "-q", help="Print only the verdict."),
        report: bool = typer.Option(
            False, "--report/--no-report", help="Print the goodput report at the end."
        ),
    ) -> int:
        """Launch and supervise training workers; restart through crashes and hangs."""
        from ..launch import config as run_config

        if not module and not Path(script).is_file():
            raise ConfigError(
                f"training script {script!r} not found", "give a path to a .py file, or use -m for a module"
            )
        if chaos_file and not Path(chaos_file).is_file():
            raise ConfigError(f"fault plan {chaos_file!r} not found")
        flags = {
            "script": script,
            "script_args": list(script_args or []),
            "module": module,
            "nproc_per_node": nproc_per_node,
            "nnodes": nnodes,
            "max_restarts": max_restarts,
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
            "startup_timeout_s": startup_timeout,
            "pg_timeout_s": pg_timeout,
            "monitor_interval_s": monitor_interval,
            "stop_grace_s": stop_grace,
            "emergency_deadline_s": emergency_deadline,
            "backoff_base_s": backoff,
            "chaos": chaos or None,
            "chaos_file": chaos_file,
            "tee": tee,
            "quiet": quiet,
            "health_gate": health_gate,
            "health_fixture": health_fixture,
            "health_active": health_active,
            "health_backend": health_backend,
            "valid_sizes": valid_sizes,
            "health_state_dir": health_state_dir,
        }
        cfg = run_config.build(flags, config_file=config)
        execute(cfg, report=report)


def execute(cfg, *, report: bool, intro: list[str] | None = None) -> None:
    """Run the agent with live console output; optionally print the report; exit with the verdict's code."""
    from .. import cli
    from ..launch.agent import Agent
    from ..launch.console import RunConsole

    if shutil.which(cfg.python) is None and not Path(cfg.python).exists():
        raise ConfigError(f"python interpreter {cfg.python!r} not found")
    console = RunConsole(quiet=cfg.quiet)
    for line in intro or ():
        console.say(line)
    agent = Agent(
        cfg, notify=console.event, progress=console.progress, started=cli.PROCESS_START, note=console.note
    )
    console.say(f"run dir: {cfg.run_dir}")
    try:
        code = agent.run_job()
    finally:
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
