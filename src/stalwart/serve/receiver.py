"""``stalwart notify serve``: an Alertmanager webhook receiver that forwards Slack/generic messages.

Alertmanager posts to ``/alertmanager`` (any path but ``/healthz`` is accepted); the receiver answers at
once (202) and the poster thread delivers. Bad input gets a 4xx with a one-line reason.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..errors import ConfigError
from .notify import Poster, Target, from_alertmanager

MAX_BODY = 1 << 20


class NotifyReceiver:
    def __init__(
        self,
        targets: Sequence[Target],
        *,
        addr: str = "127.0.0.1",
        port: int = 0,
        poster: Poster | None = None,
    ) -> None:
        if not targets and poster is None:
            raise ConfigError("no notification target", "give at least one --slack URL or --generic URL")
        self.poster = poster or Poster(targets)
        self.received = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/healthz":
                    p = receiver.poster
                    self._reply(
                        200,
                        {
                            "received": receiver.received,
                            "sent": p.sent,
                            "failed": p.failed,
                            "dropped": p.dropped,
                            "last_error": p.last_error,
                        },
                    )
                else:
                    self._reply(404, {"error": "POST Alertmanager webhooks here; GET /healthz for counters"})

            def do_POST(self) -> None:  # noqa: N802
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                except ValueError:
                    self._reply(400, {"error": "bad Content-Length"})
                    return
                if length <= 0 or length > MAX_BODY:
                    self._reply(
                        413 if length > MAX_BODY else 400,
                        {"error": f"body must be 1..{MAX_BODY} bytes of JSON, got {length}"},
                    )
                    return
                try:
                    payload = json.loads(self.rfile.read(length))
                    if not isinstance(payload, dict):
                        raise ConfigError("the body must be a JSON object")
                    messages = from_alertmanager(payload)
                except (ValueError, ConfigError) as exc:
                    self._reply(400, {"error": f"not an Alertmanager webhook payload: {exc}"})
                    return
                receiver.received += 1
                queued = sum(receiver.poster.post(m) for m in messages)
                self._reply(202, {"accepted": queued, "dropped": len(messages) - queued})

            def log_message(self, *args: object) -> None:
                pass

        try:
            self.httpd = ThreadingHTTPServer((addr, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {addr}:{port}: {exc.strerror}", "choose a free --port"
            ) from exc
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/alertmanager"

    def start(self) -> NotifyReceiver:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="stalwart-notify-receiver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()  # blocks until serve_forever returns: only call it when it runs
        self.httpd.server_close()
        self.poster.close(5.0)
