"""``stalwart notify serve``: an Alertmanager webhook receiver that forwards Slack/generic messages.

Alertmanager posts to ``/alertmanager`` (any path but ``/healthz`` is accepted); the receiver answers at
once (202) and the poster thread delivers. Bad input gets a 4xx with a one-line reason. Served by
:mod:`.httpd` (loopback by default; its timeouts and connection cap; bodies up to ``MAX_BODY``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..errors import ConfigError
from .httpd import LOOPBACK, HttpError, HttpServer, Limits, Reply, Request
from .notify import Poster, Target, from_alertmanager

MAX_BODY = 1 << 20


class NotifyReceiver:
    def __init__(
        self,
        targets: Sequence[Target],
        *,
        addr: str = LOOPBACK,
        port: int = 0,
        poster: Poster | None = None,
    ) -> None:
        if not targets and poster is None:
            raise ConfigError("no notification target", "give at least one --slack URL or --generic URL")
        self.poster = poster or Poster(targets)
        self.received = 0
        self.server = HttpServer(
            self.handle,
            addr=addr,
            port=port,
            limits=Limits(max_body=MAX_BODY),
            name="stalwart-notify-receiver",
        )

    def handle(self, req: Request) -> Reply:
        if req.method == "GET":
            if req.path != "/healthz":
                raise HttpError(404, "POST Alertmanager webhooks here; GET /healthz for counters")
            p = self.poster
            return Reply.json(
                200,
                {
                    "received": self.received,
                    "sent": p.sent,
                    "failed": p.failed,
                    "dropped": p.dropped,
                    "last_error": p.last_error,
                },
            )
        if not req.body:
            raise HttpError(400, f"body must be 1..{MAX_BODY} bytes of JSON, got 0")
        try:
            payload = json.loads(req.body)
            if not isinstance(payload, dict):
                raise ConfigError("the body must be a JSON object")
            messages = from_alertmanager(payload)
        except (ValueError, ConfigError) as exc:
            raise HttpError(400, f"not an Alertmanager webhook payload: {exc}") from None
        self.received += 1
        queued = sum(self.poster.post(m) for m in messages)
        return Reply.json(202, {"accepted": queued, "dropped": len(messages) - queued})

    @property
    def url(self) -> str:
        return self.server.url("/alertmanager")

    def start(self) -> NotifyReceiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        self.poster.close(5.0)
