"""``stalwart metrics``: serve a run's Prometheus metrics, print the shipped alert rules' path."""

from __future__ import annotations

from pathlib import Path

import typer

from ..account.mfu import MODEL_SPEC_HELP, parse_model_spec
from ..errors import ConfigError
from ..serve import LOOPBACK
from ..serve.rules import rules_path


def register(app: typer.Typer) -> None:
    metrics = typer.Typer(
        help="Prometheus metrics of a run and the shipped alert rules.", no_args_is_help=True
    )
    app.add_typer(metrics, name="metrics")

    @metrics.command("serve")
    def serve(
        run_dir: Path = typer.Argument(..., help="Run directory of 'stalwart run' (live or finished)."),
        port: int = typer.Option(9400, "--port", help="Port for /metrics (0 = any free port)."),
        addr: str = typer.Option(LOOPBACK, "--addr", help="Address to bind (loopback by default)."),
        interval: float = typer.Option(1.0, "--interval", help="Seconds between ledger polls."),
        model: str = typer.Option(
            None,
            "--model",
            help=f"Model spec for tokens/s and MFU, {MODEL_SPEC_HELP}.",
        ),
        file_sd_dir: Path = typer.Option(
            None, "--file-sd-dir", help="Under Slurm, write a Prometheus file_sd target here."
        ),
    ) -> None:
        """Serve /metrics for RUN_DIR until interrupted."""
        from ..serve.exporter import RunExporter  # deferred: heavy (aiohttp)
        from ..serve.httpd import serve_until_signal, warn_if_exposed  # deferred: heavy (aiohttp)

        if not run_dir.is_dir():
            raise ConfigError(
                f"run directory {run_dir} does not exist", "pass the --run-dir of 'stalwart run'"
            )
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port {port} is not a TCP port", "use 0..65535")
        if interval <= 0:
            raise ConfigError("--interval must be positive seconds")

        spec = parse_model_spec(model) if model else None
        exp = RunExporter(
            run_dir, addr=addr, port=port, interval_s=interval, file_sd_dir=file_sd_dir, model=spec
        ).start()

        def ready() -> None:
            warn_if_exposed("stalwart metrics serve", addr)
            print(f"serving {exp.url} for {run_dir}", flush=True)

        serve_until_signal(exp.stop, ready)

    @metrics.command("rules")
    def rules() -> None:
        """Print the path of the shipped Prometheus alert rules (alerts.yml)."""

        print(rules_path())
