"""Prometheus metrics of a run: a collector over the watcher's latest snapshot, and its HTTP endpoint.

A scrape renders the snapshot the watcher thread computed last; it never reads a ledger, so it
never waits on the agent and costs the same however long the run is. The families themselves are
in :mod:`.families`; the endpoint is served by :mod:`.httpd`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .httpd import LOOPBACK, HttpError, HttpServer, Limits, Reply, Request
from .snapshot import RunSnapshot
from .watcher import RunWatcher

if TYPE_CHECKING:
    from prometheus_client import Metric


class SnapshotCollector:
    """A prometheus_client collector: each scrape renders the watcher's latest snapshot."""

    def __init__(self, watcher: RunWatcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        from .families import families  # deferred: heavy (prometheus-client)

        yield from families(self.watcher.snapshot(), time.time())

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families vary with the run


class _OneSnapshot:
    def __init__(self, snap: RunSnapshot, now: float) -> None:
        self.snap, self.now = snap, now

    def collect(self) -> Iterator[Metric]:
        from .families import families  # deferred: heavy (prometheus-client)

        return families(self.snap, self.now)

    def describe(self) -> list[Metric]:
        return []


def render(snap: RunSnapshot, now: float) -> bytes:
    """The exposition text of one snapshot (what a scrape returns)."""
    from prometheus_client import (
        CollectorRegistry,
        generate_latest,
    )  # deferred: optional extra (prometheus-client)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_OneSnapshot(snap, now))
    return generate_latest(reg)


class MetricsServer:
    """``/metrics`` over HTTP for one run (loopback by default), backed by a watcher thread."""

    def __init__(self, watcher: RunWatcher, *, addr: str = LOOPBACK, port: int = 0) -> None:
        try:
            from prometheus_client import (
                CONTENT_TYPE_LATEST,
                CollectorRegistry,
                generate_latest,
            )  # deferred: optional extra (prometheus-client)
        except ImportError as exc:
            raise ConfigError(
                "the metrics exporter needs prometheus-client", "pip install 'stalwart[metrics]'"
            ) from exc
        self.watcher = watcher
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(watcher))
        self._content_type = CONTENT_TYPE_LATEST
        self._body: tuple[RunSnapshot, bytes] | None = None  # (snapshot, its exposition)
        self._render = generate_latest
        watcher.on_refresh.append(lambda snap: self.exposition())  # render in the watcher thread
        self._scrapes: list[float] = []
        self._scraped = threading.Condition()
        self.server = HttpServer(
            self.handle,
            addr=addr,
            port=port,
            limits=Limits(max_body=0),
            name="stalwart-metrics",
            purpose="serve metrics on",
            hint="choose a free --metrics-port, or 0 for any",
        )

    def handle(self, req: Request) -> Reply:
        if req.path not in ("/metrics", "/"):
            raise HttpError(404, "only /metrics is served here")
        if req.method != "GET":
            raise HttpError(405, "only GET /metrics is served here")
        body = self.exposition()
        self.note_scrape()
        return Reply(200, body, self._content_type)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def url(self) -> str:
        return self.server.url("/metrics")

    def start(self) -> MetricsServer:
        self.watcher.start()
        self.server.start()
        return self

    def exposition(self) -> bytes:
        """The exposition of the latest snapshot, rendered once per snapshot (normally by the watcher
        thread right after it computed the snapshot, so a scrape only sends bytes)."""
        snap = self.watcher.snapshot()
        cached = self._body
        if cached is not None and cached[0] is snap:
            return cached[1]
        body = self._render(self.registry)
        self._body = (snap, body)
        return body

    def note_scrape(self) -> None:
        with self._scraped:
            self._scrapes = [*self._scrapes[-1:], time.monotonic()]
            self._scraped.notify_all()

    def linger(self, max_s: float = 15.0) -> bool:
        """Wait (bounded) for one more scrape, so the final state is collected before the endpoint closes.

        Waits only when a scraper has been seen at least twice: up to 1.5 x its observed interval + 0.5 s,
        capped at ``max_s``. Returns whether a scrape came.
        """
        with self._scraped:
            if len(self._scrapes) < 2:
                return False
            interval = self._scrapes[-1] - self._scrapes[-2]
            seen = self._scrapes[-1]
            return self._scraped.wait_for(lambda: self._scrapes[-1] > seen, min(max_s, 1.5 * interval + 0.5))

    def stop(self) -> None:
        """Close the endpoint and stop the watcher thread (bounded waits; safe if never started)."""
        self.server.stop()
        self.watcher.stop()
