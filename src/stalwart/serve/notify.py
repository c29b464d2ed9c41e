"""Notifications: Alertmanager webhooks and run events turned into Slack-compatible or generic JSON posts.

Posting never blocks the caller: messages go into a bounded queue that one thread drains; each post
has a timeout and a bounded number of retries with backoff; when the queue is full the message is
dropped and counted (a notifier must never slow or fail a training run).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import assert_never

from ..errors import ConfigError
from ..events import DecisionTaken, Event, FailureDetected, JobEnded
from ..policy.label import Label

GENERIC_PREFIX = "generic:"


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
    url: str
    style: TargetStyle

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


@dataclass(frozen=True)
class Message:
    """One notification, renderable as Slack blocks or as generic JSON."""

    title: str
    lines: tuple[str, ...]
    severity: str = Severity.INFO  # a Severity, or an Alertmanager alert's own severity label
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join((self.title, *self.lines))

    def slack(self) -> dict[str, Any]:
        icon = _ICONS.get(self.severity, ":information_source:")
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{icon} *{self.title}*"}}
        ]
        if self.lines:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(self.lines)}})
        shown = [(k, v) for k, v in self.fields.items() if v not in (None, "")][:10]
        if shown:
            blocks.append(
                {"type": "section", "fields": [{"type": "mrkdwn", "text": f"*{k}*: {v}"} for k, v in shown]}
            )
        return {"text": self.text, "blocks": blocks}

    def generic(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "lines": list(self.lines),
            "severity": self.severity,
            "fields": dict(self.fields),
            "text": self.text,
        }

    def body(self, style: TargetStyle) -> dict[str, Any]:
        match style:
            case TargetStyle.SLACK:
                return self.slack()
            case TargetStyle.GENERIC:
                return self.generic()
            case _:
                assert_never(style)


# --- Alertmanager payloads -----------------------------------------------------------------


def from_alertmanager(payload: Mapping[str, Any]) -> list[Message]:
    """One message per alert of an Alertmanager webhook payload (version 4)."""
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise ConfigError("not an Alertmanager webhook payload: no 'alerts' list")
    common = payload.get("commonLabels") or {}
    out = []
    for a in alerts:
        if not isinstance(a, Mapping):
            raise ConfigError("not an Alertmanager webhook payload: an alert is not an object")
        labels = {**common, **(a.get("labels") or {})}
        ann = a.get("annotations") or {}
        status = a.get("status", payload.get("status", "firing"))
        name = labels.get("alertname", "alert")
        sev = Severity.RESOLVED if status == "resolved" else labels.get("severity", Severity.WARNING)
        title = f"[{status.upper()}] {name}: {ann.get('summary', '')}".rstrip(": ")
        lines = tuple(x for x in (ann.get("description", ""),) if x)
        fields = {
            k: labels[k] for k in ("run", "rank", "node", "cause", "instance", "severity") if k in labels
        }
        fields["since"] = a.get("startsAt", "")
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
                self.last_error = f"{t.url}: {exc}"
                if attempt < self.retries and self._stop.wait(self.backoff_s * 2**attempt):
                    break
        self.failed += 1

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued within ``timeout`` seconds, then stop (undelivered messages are dropped)."""
        try:
            self._q.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(1.0)
