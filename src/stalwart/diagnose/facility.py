"""Facility signals: coolant inlet temperature, coolant flow and pump state per cooling loop.

Read from a file (CSV ``ts,loop,metric,value`` or a JSON list of the same keys) or from a
Prometheus server by configurable queries (``/api/v1/query_range``, one HTTP call per metric, each
with a timeout). Metrics: ``inlet_temp_c``, ``coolant_flow_lpm``, ``pump_on`` (1/0). Readers return
samples or raise :class:`~stalwart.errors.TelemetryError`; judging them is :func:`cooling_trend`'s job.
"""

from __future__ import annotations

import csv
import io
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError, TelemetryError

METRICS = ("inlet_temp_c", "coolant_flow_lpm", "pump_on")


@dataclass(frozen=True)
class FacilitySample:
    ts: float
    loop: str
    metric: str
    value: float


def _sample(ts: object, loop: object, metric: object, value: object, where: str) -> FacilitySample:
    if metric not in METRICS:
        raise TelemetryError(
            f"{where}: unknown facility metric {metric!r}", f"use one of {', '.join(METRICS)}"
        )
    try:
        t, v = float(ts), float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TelemetryError(f"{where}: ts and value must be numbers, got {ts!r}, {value!r}") from None
    if not (math.isfinite(t) and math.isfinite(v)):
        raise TelemetryError(f"{where}: ts and value must be finite, got {ts!r}, {value!r}")
    if not loop:
        raise TelemetryError(f"{where}: empty cooling loop name")
    return FacilitySample(t, str(loop), str(metric), v)


def parse_facility_csv(text: str, origin: str = "facility CSV") -> tuple[FacilitySample, ...]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not {"ts", "loop", "metric", "value"} <= set(reader.fieldnames):
        raise TelemetryError(f"{origin}: the header must name ts,loop,metric,value")
    return tuple(
        _sample(r["ts"], r["loop"], r["metric"], r["value"], f"{origin}:{i}")
        for i, r in enumerate(reader, start=2)
    )


def parse_facility_json(text: str, origin: str = "facility JSON") -> tuple[FacilitySample, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TelemetryError(f"{origin} is not valid JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise TelemetryError(f"{origin}: expected a list of {{ts, loop, metric, value}} objects")
    return tuple(
        _sample(d.get("ts"), d.get("loop"), d.get("metric"), d.get("value"), f"{origin}[{i}]")
        for i, d in enumerate(data)
    )


def load_facility_file(path: str | Path) -> tuple[FacilitySample, ...]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TelemetryError(f"cannot read facility signals {p}: {exc.strerror}") from exc
    return (
        parse_facility_json(text, str(p)) if p.suffix.lower() == ".json" else parse_facility_csv(text, str(p))
    )


class PrometheusFacility(BaseModel):
    """Where and how to ask Prometheus. Each query must return one series per loop, labelled ``loop_label``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str = Field(description="base URL, e.g. http://prometheus:9090")
    queries: dict[str, str] = Field(description="metric name -> PromQL, e.g. inlet_temp_c: cdu_inlet_celsius")
    loop_label: str = "loop"
    timeout_s: float = Field(default=5.0, gt=0, le=60)

    def model_post_init(self, _ctx: object) -> None:
        bad = set(self.queries) - set(METRICS)
        if bad:
            raise ConfigError(
                f"unknown facility metric(s) {', '.join(sorted(bad))}", f"use {', '.join(METRICS)}"
            )
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"Prometheus URL {self.url!r} must start with http:// or https://")


def _matrix(body: bytes, metric: str, loop_label: str, where: str) -> list[FacilitySample]:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise TelemetryError(f"{where}: the answer is not JSON") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error", "unknown error") if isinstance(doc, dict) else "not an object"
        raise TelemetryError(f"{where}: Prometheus refused the query: {err}")
    out = []
    for series in (doc.get("data") or {}).get("result") or []:
        loop = (series.get("metric") or {}).get(loop_label, "")
        if not loop:
            raise TelemetryError(
                f"{where}: a series has no {loop_label!r} label",
                f"make the query keep the {loop_label} label, or set loop_label",
            )
        for ts, value in series.get("values") or []:
            out.append(_sample(ts, loop, metric, value, where))
    return out


def fetch_prometheus(
    cfg: PrometheusFacility,
    start: float,
    end: float,
    step_s: float = 15.0,
    opener: urllib.request.OpenerDirector | None = None,
) -> tuple[FacilitySample, ...]:
    """Samples of every configured metric in ``[start, end]``; one bounded HTTP GET per metric."""
    if end < start or step_s <= 0:
        raise ConfigError(f"bad Prometheus range: start={start}, end={end}, step={step_s}")
    op = opener or urllib.request.build_opener(urllib.request.ProxyHandler({}))
    out: list[FacilitySample] = []
    for metric, query in sorted(cfg.queries.items()):
        qs = urllib.parse.urlencode(
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        )
        url = f"{cfg.url.rstrip('/')}/api/v1/query_range?{qs}"
        where = f"Prometheus {cfg.url} ({metric})"
        try:
            with op.open(url, timeout=cfg.timeout_s) as resp:
                body = resp.read(16 * 1024 * 1024)
        except urllib.error.HTTPError as exc:
            body = exc.read(64 * 1024)
            try:
                detail = json.loads(body).get("error", "")
            except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
                detail = ""
            raise TelemetryError(f"{where}: HTTP {exc.code} {detail}".rstrip()) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TelemetryError(
                f"{where}: no answer within {cfg.timeout_s:g} s ({reason})",
                "check the URL and that Prometheus is reachable",
            ) from None
        out.extend(_matrix(body, metric, cfg.loop_label, where))
    return tuple(out)


@dataclass(frozen=True)
class CoolingTrend:
    loop: str
    degraded: bool
    reason: str
    inlet_rise_c: float | None = None
    flow_drop_fraction: float | None = None
    pump_stopped: bool = False


class CoolingThresholds(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    inlet_rise_c: float = Field(
        default=3.0, gt=0, description="inlet temperature rise that counts as 'rising'"
    )
    flow_drop_fraction: float = Field(default=0.2, gt=0, le=1, description="relative fall of coolant flow")


def cooling_trend(
    samples: Iterable[FacilitySample],
    loop: str,
    start: float,
    end: float,
    th: CoolingThresholds | None = None,
) -> CoolingTrend:
    """Did ``loop``'s cooling degrade within ``[start, end]``? Compares the first and last third."""
    t = th or CoolingThresholds()
    by: Mapping[str, list[FacilitySample]] = {m: [] for m in METRICS}
    for s in samples:
        if s.loop == loop and start <= s.ts <= end:
            by[s.metric].append(s)
    for rows in by.values():
        rows.sort(key=lambda s: s.ts)

    def ends(rows: list[FacilitySample]) -> tuple[float, float] | None:
        if len(rows) < 2:
            return None
        k = max(1, len(rows) // 3)
        return (sum(r.value for r in rows[:k]) / k, sum(r.value for r in rows[-k:]) / k)

    notes, degraded = [], False
    rise = drop = None
    inlet = ends(by["inlet_temp_c"])
    if inlet is not None:
        rise = inlet[1] - inlet[0]
        notes.append(f"inlet {inlet[0]:.1f} -> {inlet[1]:.1f} C")
        degraded |= rise >= t.inlet_rise_c
    flow = ends(by["coolant_flow_lpm"])
    if flow is not None and flow[0] > 0:
        drop = (flow[0] - flow[1]) / flow[0]
        notes.append(f"flow {flow[0]:.0f} -> {flow[1]:.0f} l/min")
        degraded |= drop >= t.flow_drop_fraction
    stopped = any(s.value == 0 for s in by["pump_on"])
    if stopped:
        notes.append("a pump stopped")
        degraded = True
    if not notes:
        return CoolingTrend(loop, False, f"no facility samples for loop {loop} in the window")
    word = "degraded" if degraded else "normal"
    return CoolingTrend(
        loop, degraded, f"cooling loop {loop} {word}: {', '.join(notes)}", rise, drop, stopped
    )
