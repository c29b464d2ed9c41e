"""``stalwart notify serve``: receive Alertmanager webhooks, post Slack-compatible or generic JSON."""

from __future__ import annotations

import secrets
from pathlib import Path

import typer

from ..errors import ConfigError
from ..secret_values import read_secret_file, read_url_file
from ..serve import LOOPBACK


def register(app: typer.Typer) -> None:
    notify = typer.Typer(help="Notifications: an Alertmanager webhook receiver.", no_args_is_help=True)
    app.add_typer(notify, name="notify")

    @notify.command("serve")
    def serve(
        slack: list[str] = typer.Option(
            None,
            "--slack",
            envvar="STALWART_NOTIFY_SLACK",
            help="Slack-compatible webhook URL (repeatable; a secret: prefer the variable or --slack-file).",
        ),
        slack_file: Path = typer.Option(
            None, "--slack-file", help="File (mode 0600) with one Slack webhook URL per line."
        ),
        generic: list[str] = typer.Option(
            None, "--generic", envvar="STALWART_NOTIFY_GENERIC", help="URL that gets plain JSON (repeatable)."
        ),
        generic_file: Path = typer.Option(
            None, "--generic-file", help="File (mode 0600) with one plain-JSON URL per line."
        ),
        token: str = typer.Option(
            None,
            "--token",
            envvar="STALWART_NOTIFY_TOKEN",
            help="Bearer token Alertmanager must send (http_config.authorization; default: a random one, printed).",
        ),
        token_file: Path = typer.Option(None, "--token-file", help="File (mode 0600) holding the token."),
        port: int = typer.Option(9401, "--port", help="Port to listen on (0 = any free port)."),
        addr: str = typer.Option(LOOPBACK, "--addr", help="Address to bind (loopback by default)."),
        retries: int = typer.Option(3, "--retries", help="Retries per message and target."),
        timeout: float = typer.Option(5.0, "--timeout", help="Seconds per HTTP post."),
    ) -> None:
        """Listen for Alertmanager webhooks (POST /alertmanager, with the token) and forward them until interrupted."""
        from ..serve.httpd import serve_until_signal, warn_if_exposed  # deferred: heavy (aiohttp)
        from ..serve.notify import Poster, Target  # deferred: heavy (pydantic)
        from ..serve.receiver import NotifyReceiver  # deferred: heavy (aiohttp)

        slack_urls = [*(slack or ()), *(read_url_file(slack_file, "--slack") if slack_file else [])]
        generic_urls = [*(generic or ()), *(read_url_file(generic_file, "--generic") if generic_file else [])]
        targets = [Target.parse(u) for u in slack_urls] + [Target.parse("generic:" + u) for u in generic_urls]
        if not targets:
            raise ConfigError(
                "no notification target",
                "give at least one --slack/--slack-file or --generic/--generic-file URL",
            )
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port {port} is not a TCP port", "use 0..65535")
        if retries < 0 or timeout <= 0:
            raise ConfigError("--retries must be >= 0 and --timeout positive")
        if token and token_file:
            raise ConfigError("give --token or --token-file, not both")
        tok = read_secret_file(token_file, "--token") if token_file else token or secrets.token_urlsafe(24)
        rx = NotifyReceiver(
            targets,
            token=tok,
            addr=addr,
            port=port,
            poster=Poster(targets, retries=retries, timeout_s=timeout),
        ).start()

        def ready() -> None:
            warn_if_exposed("stalwart notify serve", addr)
            print(f"receiving Alertmanager webhooks on {rx.url}", flush=True)
            if not (token or token_file):
                print(f"token (Alertmanager http_config.authorization credentials): {tok}", flush=True)

        serve_until_signal(rx.stop, ready)
