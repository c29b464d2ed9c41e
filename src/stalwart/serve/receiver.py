"""``stalwart notify serve``: an Alertmanager webhook receiver that forwards Slack/generic messages.

Alertmanager posts to ``/alertmanager`` (any path but ``/healthz`` is accepted); the receiver answers at
once (202) and the poster thread delivers. Bad input gets a 4xx with a one-line reason. Served by
:mod:`.httpd` (loopback by default; its timeouts and connection cap; bodies up to ``MAX_BODY``).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Sequence

from ..errors import ConfigError
from .httpd import LOOPBACK, HttpError, HttpServer, Limits, Reply, Request
from .notify import Poster, Target, from_alertmanager

MAX_BODY = 1 << 20
RECEIVER_PATH = "/alertmanager"
log = logging.getLogger("stalwart.notify")


class NotifyReceiver:
    def __init__(
        self,
        targets: Sequence[Target],
        *,
        token: str,
        addr: str = LOOPBACK,
        port: int = 0,
        poster: Poster | None = None,
    ) -> None:
        if not targets and poster is None:
            raise ConfigError("no notification target", "give at least one --slack URL or --generic URL")
        if len(token) < 16:
            raise ConfigError(
                "the notify token must have at least 16 characters", "use `openssl rand -hex 16`"
            )
        self.token = token
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
        if req.path != RECEIVER_PATH:
            raise HttpError(404, f"POST Alertmanager webhooks to {RECEIVER_PATH}")
        self._check_token(req.headers.get("Authorization", ""))
        if not req.body:
            raise HttpError(400, f"body must be 1..{MAX_BODY} bytes of JSON, got 0")
        try:
            messages = from_alertmanager(json.loads(req.body))
        except ValueError as exc:
            log.error("refused a webhook: not an Alertmanager webhook payload: body is not JSON (%s)", exc)
            raise HttpError(400, f"not an Alertmanager webhook payload: body is not JSON ({exc})") from None
        except ConfigError as exc:
            log.error("refused a webhook: %s", exc)
            raise HttpError(400, str(exc)) from None
        self.received += 1
        queued = sum(self.poster.post(m) for m in messages)
        return Reply.json(202, {"accepted": queued, "dropped": len(messages) - queued})

    def _check_token(self, auth: str) -> None:
        given = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        if not given:
            raise HttpError(
                401, "send 'Authorization: Bearer <token>' (Alertmanager: http_config.authorization)"
            )
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise HttpError(403, "wrong token")

    @property
    def url(self) -> str:
        return self.server.url(RECEIVER_PATH)

    def start(self) -> NotifyReceiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        self.poster.close(5.0)
