"""``stalwart notify serve``: receive Alertmanager webhooks, post Slack-compatible or generic JSON."""

from __future__ import annotations

import typer

from ..errors import ConfigError
from ..serve import LOOPBACK


def register(app: typer.Typer) -> None:
    notify = typer.Typer(help="Notifications: an Alertmanager webhook receiver.", no_args_is_help=True)
    app.add_typer(notify, name="notify")

    @notify.command("serve")
    def serve(
        slack: list[str] = typer.Option(None, "--slack", help="Slack-compatible webhook URL (repeatable)."),
        generic: list[str] = typer.Option(None, "--generic", help="URL that gets plain JSON (repeatable)."),
        port: int = typer.Option(9401, "--port", help="Port to listen on (0 = any free port)."),
        addr: str = typer.Option(LOOPBACK, "--addr", help="Address to bind (loopback by default)."),
        retries: int = typer.Option(3, "--retries", help="Retries per message and target."),
        timeout: float = typer.Option(5.0, "--timeout", help="Seconds per HTTP post."),
    ) -> None:
        """Listen for Alertmanager webhooks (POST /alertmanager) and forward them until interrupted."""
        from ..serve.httpd import serve_until_signal
        from ..serve.notify import Poster, Target
        from ..serve.receiver import NotifyReceiver

        targets = [Target.parse(u) for u in slack or ()] + [
            Target.parse("generic:" + u) for u in generic or ()
        ]
        if not targets:
            raise ConfigError("no notification target", "give at least one --slack URL or --generic URL")
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port {port} is not a TCP port", "use 0..65535")
        if retries < 0 or timeout <= 0:
            raise ConfigError("--retries must be >= 0 and --timeout positive")
        rx = NotifyReceiver(
            targets, addr=addr, port=port, poster=Poster(targets, retries=retries, timeout_s=timeout)
        ).start()
        serve_until_signal(rx.stop, lambda: print(f"receiving Alertmanager webhooks on {rx.url}", flush=True))
