"""The metric families of one run snapshot, as a Prometheus scrape returns them.

Names follow Prometheus' conventions: base units (``_seconds``, ``_ratio``), ``_total`` for counters,
``run`` on every series so several runs can share one Prometheus. Imports prometheus-client (the
``metrics`` extra): :mod:`.metrics` imports this module only when it renders.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from .snapshot import NODE_HEALTH, Checkpoints, RunSnapshot

Family = Metric  # what a collector yields
Labelled = GaugeMetricFamily | CounterMetricFamily


def families(snap: RunSnapshot, now: float) -> Iterator[Family]:
    """Every metric family of one snapshot, section by section."""
    yield from _job(snap)
    yield from _rank_families(snap)
    yield from _interruption_families(snap, now)
    if snap.checkpoints is not None:
        yield from _checkpoint_families(snap.run_id, snap.checkpoints, now)
    yield from _node_families(snap)
    if snap.tokens_per_s is not None:
        yield _gauge(
            snap.run_id,
            "stalwart_tokens_per_second",
            "Tokens per second at the ideal step time.",
            snap.tokens_per_s,
        )
    if snap.mfu is not None:
        yield _gauge(
            snap.run_id, "stalwart_mfu_ratio", "Model FLOPs utilisation at the ideal step time.", snap.mfu
        )


def _gauge(run: str, name: str, doc: str, value: float | None) -> Family:
    """A gauge with the ``run`` label only; no sample when ``value`` is None."""
    fam = GaugeMetricFamily(name, doc, labels=["run"])
    if value is not None:
        fam.add_metric([run], value)
    return fam


def _counter(name: str, doc: str, run: str, value: float) -> Family:
    fam = CounterMetricFamily(name, doc, labels=["run"])
    fam.add_metric([run], value)
    return fam


def _by_label(fam: Labelled, run: str, values: Mapping[str, float | None], *, skip: str = "") -> Family:
    """One sample per (label value, value) of ``values``, leaving out None and ``skip``."""
    for key, v in values.items():
        if v is not None and key != skip:
            fam.add_metric([run, key], v)
    return fam


def _job(snap: RunSnapshot) -> Iterator[Family]:
    run = snap.run_id
    yield _gauge(run, "stalwart_exporter_events", "Ledger events read so far by the exporter.", snap.events)
    yield _gauge(
        run,
        "stalwart_ledger_error",
        "1 when a ledger file of the run cannot be read.",
        1.0 if snap.error else 0.0,
    )
    yield _gauge(
        run,
        "stalwart_job_running",
        "1 while the job has started and not ended.",
        1.0 if snap.started and not snap.finished else 0.0,
    )
    yield _gauge(
        run,
        "stalwart_job_wall_seconds",
        "Wall time of the job so far (start to last event or end).",
        snap.wall_s,
    )
    yield _gauge(
        run,
        "stalwart_goodput_ratio",
        "Productive time / wall time (stalwart report's goodput).",
        snap.goodput if snap.started else None,
    )
    bad = GaugeMetricFamily(
        "stalwart_badput_seconds",
        "Wall time per badput bucket (stalwart report's buckets).",
        labels=["run", "bucket"],
    )
    yield _by_label(bad, run, snap.buckets, skip="productive")
    yield _gauge(
        run,
        "stalwart_productive_seconds",
        "Wall time spent on productive steps.",
        snap.buckets.get("productive"),
    )
    yield _gauge(
        run,
        "stalwart_ideal_step_seconds",
        "Ideal step time (mean of steps at or below median + 3 MAD).",
        snap.ideal_step_s or None,
    )
    yield _gauge(
        run,
        "stalwart_steps_completed",
        "Steps completed by the job (highest step + 1 on rank 0).",
        snap.steps_completed,
    )


def _rank_families(snap: RunSnapshot) -> Iterator[Family]:
    labels = ["run", "rank", "node"]
    steps = CounterMetricFamily("stalwart_rank_steps", "Steps completed per rank.", labels=labels)
    last = GaugeMetricFamily("stalwart_step_seconds", "Duration of the rank's last step.", labels=labels)
    recent = GaugeMetricFamily(
        "stalwart_step_recent_seconds", "Mean of the rank's last 20 step durations.", labels=labels
    )
    ratio = GaugeMetricFamily(
        "stalwart_step_time_ratio", "Recent step time / ideal step time (1 = nominal).", labels=labels
    )
    ts = GaugeMetricFamily(
        "stalwart_last_step_timestamp_seconds",
        "When the rank last completed a step (epoch seconds).",
        labels=labels,
    )
    strag = GaugeMetricFamily(
        "stalwart_straggler_score", "Own-work time / fleet median own-work time (1 = median).", labels=labels
    )
    for r in snap.ranks:
        lab = [snap.run_id, str(r.rank), r.node]
        steps.add_metric(lab, r.steps)
        last.add_metric(lab, r.last_step_s)
        recent.add_metric(lab, r.recent_step_s)
        ts.add_metric(lab, r.last_ts)
        if snap.ideal_step_s > 0:
            ratio.add_metric(lab, r.recent_step_s / snap.ideal_step_s)
        if r.straggler_score is not None:
            strag.add_metric(lab, r.straggler_score)
    yield from (steps, last, recent, ratio, ts, strag)


def _interruption_families(snap: RunSnapshot, now: float) -> Iterator[Family]:
    run = snap.run_id
    by_cause = ["run", "cause"]
    restarts = CounterMetricFamily(
        "stalwart_restarts", "Restart decisions by the cause they answered.", labels=by_cause
    )
    yield _by_label(restarts, run, dict(sorted(snap.restarts_by_cause.items())))
    ints = CounterMetricFamily(
        "stalwart_interruptions", "Interruptions by failure kind (stalwart report's).", labels=by_cause
    )
    yield _by_label(ints, run, dict(sorted(snap.interruptions_by_cause.items())))
    inc = CounterMetricFamily(
        "stalwart_incidents", "Interruptions by component class.", labels=["run", "class"]
    )
    yield _by_label(inc, run, dict(sorted(snap.incidents_by_class.items())))
    its = snap.interruptions
    det = SummaryMetricFamily(
        "stalwart_detection_latency_seconds", "Fault onset to detection, per interruption.", labels=["run"]
    )
    det.add_metric([run], len(its), sum(i["detection_s"] for i in its))
    yield det
    lost = SummaryMetricFamily("stalwart_lost_work_seconds", "Work lost per interruption.", labels=["run"])
    lost.add_metric([run], len(its), sum(i["lost_work_s"] for i in its))
    yield lost
    phases = GaugeMetricFamily(
        "stalwart_recovery_phase_seconds",
        "Mean time per recovery phase (MTTR split).",
        labels=["run", "phase"],
    )
    yield _by_label(phases, run, snap.mttr_s)
    mt = GaugeMetricFamily(
        "stalwart_mtbf_hours", "Mean time between failures of the run.", labels=["run", "unit"]
    )
    yield _by_label(mt, run, {"job": snap.mtbf_job_hours, "gpu": snap.mtbf_gpu_hours})
    if its:
        yield _last_interruption_cost(run, its[-1], now)


# Any: an interruption record is a JSON document of any shape (json.dumps)
def _last_interruption_cost(run: str, it: Mapping[str, Any], now: float) -> Family:
    cost = GaugeMetricFamily(
        "stalwart_last_interruption_cost_seconds",
        "Cost so far of the newest interruption.",
        labels=["run", "cause", "rank", "node"],
    )
    spent = it["total_s"]
    if spent is None:
        spent = it["lost_work_s"] + it["detection_s"] + max(0.0, now - it["detected"])
    cost.add_metric([run, it["failure"], str(it["rank"]), it["node"]], spent)
    return cost


def _checkpoint_families(run: str, ck: Checkpoints, now: float) -> Iterator[Family]:
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
    newest = ck.newest_ts
    yield _gauge(
        run,
        "stalwart_checkpoint_newest_timestamp_seconds",
        "When the newest good checkpoint committed.",
        newest,
    )
    yield _gauge(
        run,
        "stalwart_checkpoint_newest_age_seconds",
        "Age of the newest good checkpoint.",
        (now - newest) if newest is not None else None,
    )
    yield _gauge(
        run,
        "stalwart_checkpoint_newest_step",
        "Step of the newest good checkpoint.",
        ck.newest_step if newest is not None else None,
    )


def _node_families(snap: RunSnapshot) -> Iterator[Family]:
    run = snap.run_id
    state = GaugeMetricFamily(
        "stalwart_node_state", "1 for the node's current health state.", labels=["run", "node", "state"]
    )
    drained = GaugeMetricFamily(
        "stalwart_node_drained", "1 while Stalwart holds the node drained.", labels=["run", "node"]
    )
    findings = GaugeMetricFamily(
        "stalwart_node_findings",
        "Findings of the node's latest health check by severity.",
        labels=["run", "node", "severity"],
    )
    hw = GaugeMetricFamily(
        "stalwart_node_hw_slowdown",
        "1 when a GPU of the node reports a thermal/power clock slowdown.",
        labels=["run", "node", "subject"],
    )
    link = GaugeMetricFamily(
        "stalwart_node_link_errors",
        "1 when a link (IB, NVLink, PCIe) of the node reports errors.",
        labels=["run", "node", "subject"],
    )
    for n in snap.nodes:
        for st in NODE_HEALTH:
            state.add_metric([run, n.node, st], 1.0 if n.state == st else 0.0)
        drained.add_metric([run, n.node], 1.0 if n.drained else 0.0)
        for sev in ("info", "warn", "fail"):
            findings.add_metric([run, n.node, sev], sum(1 for f in n.findings if f.get("severity") == sev))
        for subject in n.hw_slowdown:
            hw.add_metric([run, n.node, subject], 1.0)
        for subject in n.link_errors:
            link.add_metric([run, n.node, subject], 1.0)
    yield from (state, drained, findings, hw, link)
