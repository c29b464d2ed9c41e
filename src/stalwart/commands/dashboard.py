"""``stalwart dashboard``: serve the web UI and JSON API over a run (or a directory of runs)."""

from __future__ import annotations

import secrets
from pathlib import Path

import typer

from ..errors import ConfigError
from ..secret_values import read_secret_file
from ..serve import LOOPBACK


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        location: Path = typer.Argument(..., help="A run directory, or a directory holding run directories."),
        port: int = typer.Option(8470, "--port", help="Port to listen on (0 = any free port)."),
        addr: str = typer.Option(LOOPBACK, "--addr", help="Address to bind (loopback by default)."),
        token: str = typer.Option(
            None,
            "--token",
            envvar="STALWART_DASHBOARD_TOKEN",
            help="Token for the API, reads and writes (default: a random one, printed).",
        ),
        token_file: Path = typer.Option(None, "--token-file", help="File (mode 0600) holding the token."),
        allow_host: list[str] = typer.Option(
            None,
            "--allow-host",
            help="Another name browsers reach this dashboard by (a proxy's; repeatable).",
        ),
        interval: float = typer.Option(1.0, "--interval", help="Seconds between ledger polls."),
    ) -> None:
        """Web UI and JSON API over the ledgers; updates live while a run is going."""
        from ..serve.dashboard import Dashboard  # deferred: heavy (aiohttp)
        from ..serve.httpd import serve_until_signal, warn_if_exposed  # deferred: heavy (aiohttp)

        if not location.is_dir():
            raise ConfigError(f"{location} is not a directory", "pass a run directory or a directory of runs")
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port {port} is not a TCP port", "use 0..65535")
        if interval <= 0:
            raise ConfigError("--interval must be positive seconds")
        if token and token_file:
            raise ConfigError("give --token or --token-file, not both")
        given = read_secret_file(token_file, "--token") if token_file else token
        tok = given or secrets.token_urlsafe(24)
        dash = Dashboard(
            location,
            token=tok,
            addr=addr,
            port=port,
            interval_s=interval,
            allow_hosts=tuple(allow_host or ()),
        ).start()

        def ready() -> None:
            warn_if_exposed("stalwart dashboard", addr)
            print(f"dashboard: {dash.url}", flush=True)
            if given:
                print(f"sign a browser in: {dash.url}login?token=<the token>", flush=True)
            else:
                print(f"sign a browser in: {dash.login_url}", flush=True)
                print(f"token for the API (Authorization: Bearer ...): {tok}", flush=True)

        serve_until_signal(dash.stop, ready)
