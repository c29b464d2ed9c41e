"""Notifications: Alertmanager webhooks and run events turned into Slack-compatible or generic JSON posts.

Posting never blocks the caller: messages go into a bounded queue that one thread drains; each post
has a timeout and a bounded number of retries with backoff; when the queue is full the message is
dropped and counted (a notifier must never slow or fail a training run).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import assert_never

from ..errors import ConfigError
from ..events import DecisionTaken, Event, FailureDetected, JobEnded
from ..policy.label import Label
from ..secret_values import redact_url, scrub

GENERIC_PREFIX = "generic:"
log = logging.getLogger("stalwart.notify")


class TargetStyle(Label):
    """What a target expects: Slack-compatible blocks, or plain JSON."""

    SLACK = "slack"
    GENERIC = "generic"


class Severity(Label):
    """The severities this module decides on; an Alertmanager label may carry any other word."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"
    RESOLVED = "resolved"


_ICONS: dict[str, str] = {
    Severity.CRITICAL: ":rotating_light:",
    Severity.WARNING: ":warning:",
    Severity.RESOLVED: ":white_check_mark:",
}


@dataclass(frozen=True)
class Target:
    url: str = field(repr=False)  # a credential: shown only through redact_url
    style: TargetStyle = TargetStyle.SLACK

    def __post_init__(self) -> None:
        object.__setattr__(self, "style", TargetStyle(self.style))  # "slack" -> TargetStyle.SLACK

    @classmethod
    def parse(cls, spec: str) -> Target:
        style, url = (
            (TargetStyle.GENERIC, spec[len(GENERIC_PREFIX) :])
            if spec.startswith(GENERIC_PREFIX)
            else (TargetStyle.SLACK, spec)
        )
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"notification URL {spec!r} is not http(s)",
                "give http(s)://host/path, or generic:http(s)://... for plain JSON",
            )
        return cls(url, style)

    def __str__(self) -> str:
        return f"{self.style} {redact_url(self.url)}"


def slack_escape(text: str) -> str:
    """``text`` as Slack shows it literally: ``&``, ``<`` and ``>`` escaped, so that ``<!channel>``,
    ``<@U123>`` and ``<https://evil|innocent>`` from an alert or a script's error stay plain text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass(frozen=True)
class Message:
    """One notification, renderable as Slack blocks or as generic JSON."""

    title: str
    lines: tuple[str, ...]
    severity: str = Severity.INFO  # a Severity, or an Alertmanager alert's own severity label
    # Any: alert fields are a JSON document of any shape (json.dumps)
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join((self.title, *self.lines))

    def slack(self) -> dict[str, Any]:  # Any: a JSON document of any shape (json.dumps)
        """Slack blocks; every text that came from outside (alert labels, a script's error) escaped."""
        esc = slack_escape
        icon = _ICONS.get(self.severity, ":information_source:")
        blocks: list[dict[str, Any]] = [  # Any: Slack's JSON blocks, of any shape
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{icon} *{esc(self.title)}*"}}
        ]
        if self.lines:
            text = esc("\n".join(self.lines))
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
        shown = [(k, v) for k, v in self.fields.items() if v not in (None, "")][:10]
        if shown:
            blocks.append(
                {
                    "type": "section",
                    "fields": [
                        {"type": "mrkdwn", "text": f"*{esc(str(k))}*: {esc(str(v))}"} for k, v in shown
                    ],
                }
            )
        return {"text": esc(self.text), "blocks": blocks}

    def generic(self) -> dict[str, Any]:  # Any: a JSON document of any shape (json.dumps)
        return {
            "title": self.title,
            "lines": list(self.lines),
            "severity": self.severity,
            "fields": dict(self.fields),
            "text": self.text,
        }

    def body(self, style: TargetStyle) -> dict[str, Any]:  # Any: a JSON document of any shape (json.dumps)
        match style:
            case TargetStyle.SLACK:
                return self.slack()
            case TargetStyle.GENERIC:
                return self.generic()
            case _:
                assert_never(style)


# --- Alertmanager payloads -----------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class AlertIn(_Strict):
    """One alert of an Alertmanager webhook (version 4); fields Stalwart does not use are ignored."""

    status: Literal["firing", "resolved"] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""  # noqa: N815 - Alertmanager's name


class WebhookIn(_Strict):
    """An Alertmanager webhook payload (version 4)."""

    status: Literal["firing", "resolved"] = "firing"
    alerts: list[AlertIn] = Field(max_length=1000)
    commonLabels: dict[str, str] = Field(default_factory=dict)  # noqa: N815 - Alertmanager's name


def parse_webhook(payload: object) -> WebhookIn:
    """``payload`` checked against :class:`WebhookIn`; a ConfigError naming the first bad field."""
    try:
        return WebhookIn.model_validate(payload)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "the body"
        raise ConfigError(f"not an Alertmanager webhook payload: {where}: {err['msg']}") from None


def from_alertmanager(payload: object) -> list[Message]:
    """One message per alert of an Alertmanager webhook payload (version 4)."""
    hook = parse_webhook(payload)
    out = []
    for a in hook.alerts:
        labels = {**hook.commonLabels, **a.labels}
        ann = a.annotations
        status = a.status or hook.status
        name = labels.get("alertname", "alert")
        sev = Severity.RESOLVED if status == "resolved" else labels.get("severity", Severity.WARNING)
        title = f"[{status.upper()}] {name}: {ann.get('summary', '')}".rstrip(": ")
        lines = tuple(x for x in (ann.get("description", ""),) if x)
        fields: dict[str, object] = {
            k: labels[k] for k in ("run", "rank", "node", "cause", "instance", "severity") if k in labels
        }
        fields["since"] = a.startsAt
        out.append(Message(title, lines, sev, fields))
    return out


# --- run events ----------------------------------------------------------------------------


class RunNotifier:
    """Attach to the agent's notify chain: posts interruptions (with the decision) and the verdict.

    Call it with every event the agent shows; it keeps the failure it saw last so the decision that
    answers it can name the cause. Never raises.
    """

    def __init__(self, targets: Sequence[Target], *, poster: Poster | None = None) -> None:
        self.poster = poster or Poster(targets)
        self._failure: FailureDetected | None = None
        self._started = time.time()
        self._restarts = 0

    def __call__(self, ev: Event) -> None:
        try:
            msg = self.message(ev)
        except Exception:  # noqa: BLE001 - a notification bug must not stop the run
            return
        if msg is not None:
            self.poster.post(msg)

    def message(self, ev: Event) -> Message | None:
        if isinstance(ev, FailureDetected):
            if self._failure is None or (self._failure.failure == "peer_lost" and ev.failure != "peer_lost"):
                self._failure = ev
            return None
        if isinstance(ev, DecisionTaken):
            f, self._failure = self._failure, None
            if f is None:
                return None
            self._restarts += ev.action == "restart"
            cost = max(0.0, ev.ts - f.onset)
            title = (
                f"run {ev.run_id}: {f.failure} of rank {f.rank} on {f.node or '?'} at step {f.step}"
                f" -> {ev.action}"
            )
            return Message(
                title,
                (f.evidence, ev.reason),
                Severity.WARNING if ev.action == "restart" else Severity.CRITICAL,
                {
                    "run": ev.run_id,
                    "rank": f.rank,
                    "node": f.node,
                    "cause": f.failure,
                    "step": f.step,
                    "action": ev.action,
                    "restarts": f"{ev.restarts_used}/{ev.restarts_allowed}",
                    "cost so far": f"{cost:.1f}s (onset to decision)",
                },
            )
        if isinstance(ev, JobEnded):
            sev = Severity.RESOLVED if ev.outcome == "succeeded" else Severity.CRITICAL
            return Message(
                f"run {ev.run_id}: {ev.outcome} (exit {ev.exit_code})",
                (ev.verdict,),
                sev,
                {
                    "run": ev.run_id,
                    "outcome": ev.outcome,
                    "exit code": ev.exit_code,
                    "requeue helps": "yes" if ev.requeue_helps else "no",
                    "restarts": self._restarts,
                },
            )
        return None

    def close(self, timeout: float = 5.0) -> None:
        self.poster.close(timeout)


# --- delivery ------------------------------------------------------------------------------


# Any: a JSON document of any shape (json.dumps)
def _http_post(url: str, body: dict[str, Any], timeout: float) -> None:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - configured http(s) URL
        resp.read(1024)


class Poster:
    """Bounded queue + one thread; each message goes to every target, retried with backoff."""

    def __init__(
        self,
        targets: Sequence[Target],
        *,
        maxsize: int = 256,
        retries: int = 3,
        timeout_s: float = 5.0,
        backoff_s: float = 0.5,
        # Any: a JSON document of any shape (json.dumps)
        send: Callable[[str, dict[str, Any], float], None] = _http_post,
    ) -> None:
        self.targets = tuple(targets)
        self.retries = retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._send = send
        self._q: queue.Queue[Message | None] = queue.Queue(maxsize)
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stalwart-notify", daemon=True)
        self._thread.start()

    def post(self, msg: Message) -> bool:
        """Queue ``msg``; returns False (and counts it) when the queue is full. Never blocks."""
        try:
            self._q.put_nowait(msg)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def _loop(self) -> None:
        while True:
            msg = self._q.get()
            if msg is None:
                return
            for t in self.targets:
                self._deliver(t, msg)

    def _deliver(self, t: Target, msg: Message) -> None:
        for attempt in range(self.retries + 1):
            try:
                self._send(t.url, msg.body(t.style), self.timeout_s)
                self.sent += 1
                return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                # never the URL itself: its path is the webhook's token
                self.last_error = scrub(f"{redact_url(t.url)}: {exc}", [t.url])
                if attempt < self.retries and self._stop.wait(self.backoff_s * 2**attempt):
                    break
        self.failed += 1
        log.warning("notification not delivered after %d tries: %s", self.retries + 1, self.last_error)

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued within ``timeout`` seconds, then stop (undelivered messages are dropped)."""
        try:
            self._q.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(1.0)
