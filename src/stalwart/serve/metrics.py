"""Prometheus metrics of a run: a collector over the watcher's latest snapshot, and its HTTP endpoint.

A scrape renders the snapshot the watcher thread computed last; it never reads a ledger, so it
never waits on the agent and costs the same however long the run is. Names follow Prometheus'
conventions: base units (``_seconds``, ``_ratio``), ``_total`` for counters, ``run`` on every
series so several runs can share one Prometheus.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..errors import ConfigError
from .snapshot import RunSnapshot
from .watcher import RunWatcher

NODE_STATES = ("healthy", "suspect", "quarantined", "probation", "unknown")


def _families(snap: RunSnapshot, now: float) -> Iterator:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

    run = snap.run_id
    g = GaugeMetricFamily

    def gauge(name: str, doc: str, value: float | None, **labels: str):
        fam = g(name, doc, labels=["run", *labels])
        if value is not None:
            fam.add_metric([run, *labels.values()], value)
        return fam

    yield gauge("stalwart_exporter_events", "Ledger events read so far by the exporter.", snap.events)
    yield gauge(
        "stalwart_ledger_error", "1 when a ledger file of the run cannot be read.", 1.0 if snap.error else 0.0
    )
    yield gauge(
        "stalwart_job_running",
        "1 while the job has started and not ended.",
        1.0 if snap.started and not snap.finished else 0.0,
    )
    yield gauge(
        "stalwart_job_wall_seconds", "Wall time of the job so far (start to last event or end).", snap.wall_s
    )
    yield gauge(
        "stalwart_goodput_ratio",
        "Productive time / wall time (stalwart report's goodput).",
        snap.goodput if snap.started else None,
    )
    bad = g(
        "stalwart_badput_seconds",
        "Wall time per badput bucket (stalwart report's buckets).",
        labels=["run", "bucket"],
    )
    for bucket, secs in snap.buckets.items():
        if bucket != "productive":
            bad.add_metric([run, bucket], secs)
    yield bad
    yield gauge(
        "stalwart_productive_seconds", "Wall time spent on productive steps.", snap.buckets.get("productive")
    )
    yield gauge(
        "stalwart_ideal_step_seconds",
        "Ideal step time (mean of steps at or below median + 3 MAD).",
        snap.ideal_step_s or None,
    )
    yield gauge(
        "stalwart_steps_completed",
        "Steps completed by the job (highest step + 1 on rank 0).",
        snap.steps_completed,
    )

    steps = CounterMetricFamily(
        "stalwart_rank_steps", "Steps completed per rank.", labels=["run", "rank", "node"]
    )
    last = g("stalwart_step_seconds", "Duration of the rank's last step.", labels=["run", "rank", "node"])
    recent = g(
        "stalwart_step_recent_seconds",
        "Mean of the rank's last 20 step durations.",
        labels=["run", "rank", "node"],
    )
    ratio = g(
        "stalwart_step_time_ratio",
        "Recent step time / ideal step time (1 = nominal).",
        labels=["run", "rank", "node"],
    )
    ts = g(
        "stalwart_last_step_timestamp_seconds",
        "When the rank last completed a step (epoch seconds).",
        labels=["run", "rank", "node"],
    )
    strag = g(
        "stalwart_straggler_score",
        "Own-work time / fleet median own-work time (1 = median).",
        labels=["run", "rank", "node"],
    )
    for r in snap.ranks:
        lab = [run, str(r.rank), r.node]
        steps.add_metric(lab, r.steps)
        last.add_metric(lab, r.last_step_s)
        recent.add_metric(lab, r.recent_step_s)
        ts.add_metric(lab, r.last_ts)
        if snap.ideal_step_s > 0:
            ratio.add_metric(lab, r.recent_step_s / snap.ideal_step_s)
        if r.straggler_score is not None:
            strag.add_metric(lab, r.straggler_score)
    yield from (steps, last, recent, ratio, ts, strag)

    restarts = CounterMetricFamily(
        "stalwart_restarts", "Restart decisions by the cause they answered.", labels=["run", "cause"]
    )
    for cause, n in sorted(snap.restarts_by_cause.items()):
        restarts.add_metric([run, cause], n)
    yield restarts
    ints = CounterMetricFamily(
        "stalwart_interruptions",
        "Interruptions by failure kind (stalwart report's).",
        labels=["run", "cause"],
    )
    for cause, n in sorted(snap.interruptions_by_cause.items()):
        ints.add_metric([run, cause], n)
    yield ints
    inc = CounterMetricFamily(
        "stalwart_incidents", "Interruptions by component class.", labels=["run", "class"]
    )
    for cls, n in sorted(snap.incidents_by_class.items()):
        inc.add_metric([run, cls], n)
    yield inc
    det = SummaryMetricFamily(
        "stalwart_detection_latency_seconds", "Fault onset to detection, per interruption.", labels=["run"]
    )
    det.add_metric([run], len(snap.interruptions), sum(i["detection_s"] for i in snap.interruptions))
    yield det
    lost = SummaryMetricFamily("stalwart_lost_work_seconds", "Work lost per interruption.", labels=["run"])
    lost.add_metric([run], len(snap.interruptions), sum(i["lost_work_s"] for i in snap.interruptions))
    yield lost
    phases = g(
        "stalwart_recovery_phase_seconds",
        "Mean time per recovery phase (MTTR split).",
        labels=["run", "phase"],
    )
    for phase, v in snap.mttr_s.items():
        if v is not None:
            phases.add_metric([run, phase], v)
    yield phases
    mt = g("stalwart_mtbf_hours", "Mean time between failures of the run.", labels=["run", "unit"])
    for unit, v in (("job", snap.mtbf_job_hours), ("gpu", snap.mtbf_gpu_hours)):
        if v is not None:
            mt.add_metric([run, unit], v)
    yield mt
    if snap.interruptions:
        last_it = snap.interruptions[-1]
        cost = g(
            "stalwart_last_interruption_cost_seconds",
            "Cost so far of the newest interruption.",
            labels=["run", "cause", "rank", "node"],
        )
        spent = last_it["total_s"]
        if spent is None:
            spent = last_it["lost_work_s"] + last_it["detection_s"] + max(0.0, now - last_it["detected"])
        cost.add_metric([run, last_it["failure"], str(last_it["rank"]), last_it["node"]], spent)
        yield cost

    ck = snap.checkpoints
    if ck is not None:
        for name, doc, values in (
            ("stalwart_checkpoint_stall_seconds", "Training-loop stall per checkpoint save.", ck.stall_s),
            ("stalwart_checkpoint_persist_seconds", "Background persist time per checkpoint.", ck.persist_s),
            ("stalwart_checkpoint_restore_seconds", "Checkpoint load time per restore.", ck.restore_s),
        ):
            fam = SummaryMetricFamily(name, doc, labels=["run"])
            fam.add_metric([run], len(values), sum(values))
            yield fam
        yield _counter("stalwart_checkpoints_committed", "Checkpoints committed.", run, ck.committed)
        yield _counter(
            "stalwart_checkpoints_rejected", "Checkpoints skipped on load (torn, corrupt).", run, ck.rejected
        )
        yield gauge(
            "stalwart_checkpoint_newest_timestamp_seconds",
            "When the newest good checkpoint committed.",
            ck.newest_ts,
        )
        yield gauge(
            "stalwart_checkpoint_newest_age_seconds",
            "Age of the newest good checkpoint.",
            (now - ck.newest_ts) if ck.newest_ts is not None else None,
        )
        yield gauge(
            "stalwart_checkpoint_newest_step",
            "Step of the newest good checkpoint.",
            ck.newest_step if ck.newest_ts is not None else None,
        )

    state = g(
        "stalwart_node_state", "1 for the node's current health state.", labels=["run", "node", "state"]
    )
    drained = g("stalwart_node_drained", "1 while Stalwart holds the node drained.", labels=["run", "node"])
    findings = g(
        "stalwart_node_findings",
        "Findings of the node's latest health check by severity.",
        labels=["run", "node", "severity"],
    )
    hw = g(
        "stalwart_node_hw_slowdown",
        "1 when a GPU of the node reports a thermal/power clock slowdown.",
        labels=["run", "node", "subject"],
    )
    link = g(
        "stalwart_node_link_errors",
        "1 when a link (IB, NVLink, PCIe) of the node reports errors.",
        labels=["run", "node", "subject"],
    )
    for n in snap.nodes:
        for st in NODE_STATES:
            state.add_metric([run, n.node, st], 1.0 if n.state == st else 0.0)
        drained.add_metric([run, n.node], 1.0 if n.drained else 0.0)
        for sev in ("info", "warn", "fail"):
            findings.add_metric([run, n.node, sev], sum(1 for f in n.findings if f.get("severity") == sev))
        for subject in n.hw_slowdown:
            hw.add_metric([run, n.node, subject], 1.0)
        for subject in n.link_errors:
            link.add_metric([run, n.node, subject], 1.0)
    yield from (state, drained, findings, hw, link)
    if snap.tokens_per_s is not None:
        yield gauge(
            "stalwart_tokens_per_second", "Tokens per second at the ideal step time.", snap.tokens_per_s
        )
    if snap.mfu is not None:
        yield gauge("stalwart_mfu_ratio", "Model FLOPs utilisation at the ideal step time.", snap.mfu)


def _counter(name: str, doc: str, run: str, value: float):
    from prometheus_client.core import CounterMetricFamily

    fam = CounterMetricFamily(name, doc, labels=["run"])
    fam.add_metric([run], value)
    return fam


class SnapshotCollector:
    """A prometheus_client collector: each scrape renders the watcher's latest snapshot."""

    def __init__(self, watcher: RunWatcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator:
        yield from _families(self.watcher.snapshot(), time.time())

    def describe(self) -> list:
        return []  # unchecked collector: families vary with the run


def render(snap: RunSnapshot, now: float) -> bytes:
    """The exposition text of one snapshot (what a scrape returns)."""
    from prometheus_client import CollectorRegistry, generate_latest

    class _One:
        def collect(self):
            return _families(snap, now)

        def describe(self):
            return []

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_One())
    return generate_latest(reg)


class MetricsServer:
    """``/metrics`` over HTTP for one run (loopback by default), backed by a watcher thread."""

    def __init__(self, watcher: RunWatcher, *, addr: str = "127.0.0.1", port: int = 0) -> None:
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        except ImportError as exc:
            raise ConfigError(
                "the metrics exporter needs prometheus-client", "pip install 'stalwart[metrics]'"
            ) from exc
        self.watcher = watcher
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(watcher))
        server = self
        self._body: tuple[RunSnapshot, bytes] | None = None  # (snapshot, its exposition)
        self._render = generate_latest
        watcher.on_refresh.append(lambda snap: self.exposition())  # render in the watcher thread
        self._scrapes: list[float] = []
        self._scraped = threading.Condition()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                body = server.exposition()
                server.note_scrape()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        try:
            self.httpd = ThreadingHTTPServer((addr, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {addr}:{port}: {exc.strerror}",
                "choose a free --metrics-port, or 0 for any",
            ) from exc
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/metrics"

    def start(self) -> MetricsServer:
        self.watcher.start()
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="stalwart-metrics",
            daemon=True,
        )
        self._thread.start()
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
        if self._thread is not None:
            self.httpd.shutdown()  # blocks until serve_forever returns: only call it when it runs
        self.httpd.server_close()
        self.watcher.stop()
        if self._thread is not None:
            self._thread.join(5.0)
