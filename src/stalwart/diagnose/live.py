"""Diagnosis during a run: the agent's collector that turns the run's events into incidents live.

Started by the agent for the job and stopped when it ends. Every ``interval_s`` it

1. reads the run's new ledger events (all nodes' agents share the run directory's ledger files;
   step records are skipped),
2. reads this node's evidence: kernel-log Xid lines (``--kernel-log``), node telemetry in the health
   fixture format (``--node-telemetry``: GPU snapshot/series, InfiniBand sysfs), facility samples
   (``--facility`` file or Prometheus) and the topology (``--topology``),
3. runs the pure diagnoses (:func:`~stalwart.diagnose.pipeline.incidents_from_events`,
   :func:`~stalwart.diagnose.seams.cooling_seams`, :func:`~stalwart.diagnose.seams.blast_radius`),
4. raises each new incident once as an ``IncidentRaised`` event, in its own ledger file (so it never
   shares a writer with the agent's thread) and on the console,
5. routes around a sick link of its own node: an incident whose action is ``route_around_hca``
   gets the NCCL environment change for the next attempt (:mod:`~stalwart.diagnose.route_around`);
   the agent takes :meth:`LiveDiagnosis.route_env` into its workers' environment on the next start.

"Once" holds across the agents of a run that share the run directory: an incident claims a marker
file (``incidents/<key>``) with an atomic exclusive create before it is raised.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError, StalwartError
from ..events import AttemptStarted, Event, IncidentRaised, StragglerCleared, StragglerDetected
from ..health.gate import GateConfig, collect_findings
from ..health.kernel_log import read_kernel_log_file, read_uptime
from ..ledger import LedgerWriter, ledger_files
from ..ledger.store import _connect_read, _decode_row
from ..protocol.run_dir import RunDir
from .facility import FacilitySample, PrometheusFacility, fetch_prometheus, load_facility_file
from .incident import BlastRadius, Component, FaultClass, Incident
from .pipeline import evidence_signals, incidents_from_events
from .route_around import route_incident
from .seams import NodeFault, SeamConfig, SlowRank, blast_radius, cooling_seams
from .signals import Signal, from_findings, from_kernel_log
from .topology import Topology, load_topology

SKIPPED_KINDS = ("StepCompleted",)  # the bulk of a ledger; no diagnosis here reads it
NO_CAUSE_GRACE_S = 10.0  # an unexplained failure waits this long for another agent's explanation


class LiveSources(BaseModel):
    """Where this node's evidence comes from (all optional; without any, failures are still joined
    with the health findings the gate recorded in the ledger)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topology: Path | None = None
    facility: str = ""  # a CSV/JSON file, or a Prometheus base URL
    facility_queries: dict[str, str] = Field(default_factory=dict)  # metric -> PromQL (Prometheus only)
    kernel_log: Path | None = None  # a file with dmesg-style lines ([seconds since boot] ...)
    node_telemetry: Path | None = None  # a directory in the health fixture format
    interval_s: float = Field(default=2.0, gt=0)

    def prometheus(self) -> PrometheusFacility | None:
        if not self.facility.startswith(("http://", "https://")):
            return None
        return PrometheusFacility(url=self.facility, queries=self.facility_queries)


def parse_queries(items: Sequence[str]) -> dict[str, str]:
    """``metric=PromQL`` items (``--facility-query``) as a mapping; bad items raise one ConfigError."""
    out = {}
    for item in items:
        key, sep, query = item.partition("=")
        if not sep or not key.strip() or not query.strip():
            raise ConfigError(
                f"--facility-query {item!r} is not metric=PromQL",
                "e.g. --facility-query inlet_temp_c=cdu_inlet_celsius",
            )
        out[key.strip()] = query.strip()
    return out


def validate_sources(
    topology: Path | None,
    facility: str,
    queries: Sequence[str],
    kernel_log: Path | None,
    telemetry: Path | None,
) -> LiveSources:
    """Check the diagnosis flags before the job starts (one ConfigError line each)."""
    if topology is not None:
        load_topology(topology)
    qs = parse_queries(queries)
    if qs and not facility.startswith(("http://", "https://")):
        raise ConfigError("--facility-query needs --facility http(s)://prometheus:9090")
    src = LiveSources(
        topology=topology,
        facility=facility,
        facility_queries=qs,
        kernel_log=kernel_log,
        node_telemetry=telemetry,
    )
    if src.prometheus() is not None and not qs:
        raise ConfigError(
            f"--facility {facility} is a Prometheus URL but no --facility-query was given",
            "add --facility-query inlet_temp_c=<PromQL> (and coolant_flow_lpm, pump_on)",
        )
    if facility and src.prometheus() is None and not Path(facility).is_file():
        raise ConfigError(f"--facility {facility}: no such file", "give a CSV/JSON file or an http(s) URL")
    if telemetry is not None and not telemetry.is_dir():
        raise ConfigError(f"--node-telemetry {telemetry} is not a directory")
    return src


def incident_key(ev: IncidentRaised) -> str:
    """What makes two raises the same incident (across polls and across agents): the same rule on
    the same node(s) or domain from the same onset, i.e. the same evidence. Two failures explained by
    one kernel-log line are one incident."""
    where = ev.domain or ",".join(ev.nodes)
    return f"{ev.rule}|{where}|{int(ev.onset)}"


class LedgerTail:
    """New events of a run's ledger files since the last read (sqlite rows by sequence number)."""

    def __init__(self, ledger_dir: Path, skip: Sequence[str] = SKIPPED_KINDS):
        self.dir = ledger_dir
        self.skip = tuple(skip)
        self.seen: dict[Path, int] = {}

    def read(self) -> list[Event]:
        try:
            files = ledger_files(self.dir)
        except StalwartError:
            return []
        out: list[Event] = []
        marks = ",".join("?" for _ in self.skip) or "''"
        for f in files:
            last = self.seen.get(f, 0)
            try:
                conn = _connect_read(f)
                try:
                    rows = conn.execute(
                        f"SELECT seq, kind, payload FROM events WHERE seq > ? AND kind NOT IN ({marks}) "
                        "ORDER BY seq",
                        (last, *self.skip),
                    ).fetchall()
                    top = conn.execute("SELECT MAX(seq) FROM events").fetchone()[0]
                finally:
                    conn.close()
            except (StalwartError, sqlite3.Error):
                continue  # being created, or not a ledger: the next poll tries again
            for _seq, kind, payload in rows:
                got = _decode_row(kind, payload)
                if not isinstance(got, str):
                    out.append(got)
            self.seen[f] = max(last, top or 0)
        return out


def open_stragglers(events: Sequence[Event], node: str) -> tuple[SlowRank, ...]:
    """Stragglers on ``node`` that were detected and not cleared (the console's own events)."""
    open_: dict[tuple[int, int], StragglerDetected] = {}
    for e in sorted(events, key=lambda e: e.ts):
        if isinstance(e, StragglerDetected) and e.node == node:
            open_.setdefault((e.attempt, e.rank), e)
        elif isinstance(e, StragglerCleared) and e.node == node:
            open_.pop((e.attempt, e.rank), None)
    return tuple(
        SlowRank(node=d.node, rank=d.rank, since=d.ts, slowdown=d.score, evidence=d.evidence)
        for d in sorted(open_.values(), key=lambda d: (d.ts, d.rank))
    )


def node_faults(events: Sequence[Event]) -> tuple[NodeFault, ...]:
    """Node-level incidents already in the ledger (any agent's), as faults for the blast radius."""
    return tuple(
        NodeFault(e.nodes[0], e.onset or e.ts, e.cause)
        for e in events
        if isinstance(e, IncidentRaised)
        and len(e.nodes) == 1
        and not e.domain
        and not e.rule.startswith(("seam:", "policy:"))
    )


def diagnose_now(
    events: Sequence[Event],
    node_signals: Sequence[Signal],
    facility: Sequence[FacilitySample],
    topology: Topology | None,
    node: str,
    now: float,
    seams: SeamConfig | None = None,
) -> tuple[Incident, ...]:
    """Every incident the evidence supports at ``now`` (pure; the caller raises the new ones)."""
    cfg = seams or SeamConfig()
    out = list(incidents_from_events(events, now, extra=node_signals))
    attempts = [e for e in events if isinstance(e, AttemptStarted)]
    gpus = max((a.world_size for a in attempts), default=0)
    if topology is not None:
        slow = open_stragglers(events, node)
        if slow:
            sigs = tuple(node_signals) + evidence_signals(events)
            out += cooling_seams(slow, sigs, facility, topology, now, gpus=gpus, cfg=cfg)
        mine = [i.to_event() for i in out]
        faults = node_faults([*events, *mine])
        decision = blast_radius(faults, topology, now, cfg)
        for inc in decision.incidents:
            out.append(dataclasses.replace(inc, evidence=(*inc.evidence, f"decision: {decision.reason}")))
    return tuple(out)


class LiveDiagnosis:
    """The collector. ``poll(now)`` is one bounded round; ``start``/``stop`` run it on a thread."""

    def __init__(
        self,
        run: RunDir,
        node: str,
        run_id: str,
        sources: LiveSources,
        *,
        notify: Callable[[Event], None] = lambda ev: None,
        clock: Callable[[], float] = time.time,
        uptime: Callable[[], float | None] | None = None,
        attempt: Callable[[], int] = lambda: -1,
    ):

        self.run, self.node, self.run_id, self.src = run, node, run_id, sources
        self.notify, self.clock, self.attempt = notify, clock, attempt
        self.topology = load_topology(sources.topology) if sources.topology else None
        up = (uptime or read_uptime)()
        self.boot_epoch = clock() - up if up is not None else None  # once: onsets must not jitter
        self.tail = LedgerTail(run.ledger)
        self.events: list[Event] = []
        self.raised: set[str] = set()
        self._claims = run.root / "incidents"
        self._writer: LedgerWriter | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._telemetry_mark: tuple = ()
        self._telemetry: tuple[Signal, ...] = ()
        self.errors: list[str] = []
        self._failing: dict[str, float] = {}  # error text -> when first seen
        self._lock = threading.Lock()  # one round at a time: the thread's, or the agent's refresh
        self._job_env = dict(os.environ)  # what the workers inherit (a user's own NCCL_IB_HCA)
        self._route: dict[str, str] = {}  # environment changes decided by route-around incidents

    # --- evidence ----------------------------------------------------------------------------

    def node_signals(self) -> tuple[Signal, ...]:
        out: list[Signal] = []
        if self.src.kernel_log is not None and self.boot_epoch is not None:
            obs = read_kernel_log_file(self.src.kernel_log)
            if obs.available:
                out += from_kernel_log(obs, self.node, self.boot_epoch)
        if self.src.node_telemetry is not None:
            out += self._telemetry_signals(self.src.node_telemetry)
        return tuple(out)

    def _telemetry_signals(self, d: Path) -> tuple[Signal, ...]:
        """Findings of a health-fixture directory; re-read only when a file in it changed. The
        recording is taken to end at the newest file's mtime, so a series finding is placed at
        ``mtime - (last sample t - first_t)``."""

        files = sorted(p for p in d.rglob("*") if p.is_file())
        mark = tuple((str(p), p.stat().st_mtime_ns) for p in files)
        if mark == self._telemetry_mark:
            return self._telemetry
        findings, gpu, _ib, _t = collect_findings(GateConfig(fixture=d, kernel_log="", allreduce=False))
        newest = max((p.stat().st_mtime for p in files), default=self.clock())
        last_t = max((s.t for s in gpu.series), default=0.0)
        self._telemetry = from_findings(findings, self.node, newest - last_t)
        self._telemetry_mark = mark
        return self._telemetry

    def facility_samples(self, now: float) -> tuple[FacilitySample, ...]:
        if not self.src.facility:
            return ()
        prom = self.src.prometheus()
        if prom is not None:
            return fetch_prometheus(prom, now - SeamConfig().window_s, now)
        return load_facility_file(self.src.facility)

    # --- one round ---------------------------------------------------------------------------

    def poll(self, now: float | None = None, *, final: bool = False) -> tuple[IncidentRaised, ...]:
        """One round. ``final``: the job is over, an unexplained failure need not wait any longer."""
        now = self.clock() if now is None else now
        self.events.extend(self.tail.read())
        sigs: tuple[Signal, ...] = ()
        fac: tuple[FacilitySample, ...] = ()
        broken: list[Incident] = []
        try:
            sigs = self.node_signals()
        except (StalwartError, OSError) as exc:  # a source that cannot be read is an incident, never fatal
            broken.append(self._source_failed("node evidence (kernel log / node telemetry)", exc, now))
        try:
            fac = self.facility_samples(now)
        except (StalwartError, OSError) as exc:
            broken.append(self._source_failed("facility telemetry", exc, now))
        found = (*broken, *diagnose_now(self.events, sigs, fac, self.topology, self.node, now))
        explained = {
            int(e.onset) for e in self.events if isinstance(e, IncidentRaised) and e.rule.startswith("cross")
        }
        new = []
        for inc in found:
            if inc.rule == "cross_layer:no-cause":
                # another agent may hold the node evidence that explains it: give it time to say so
                if (not final and now - inc.onset < NO_CAUSE_GRACE_S) or any(
                    abs(t - inc.onset) <= 1 for t in explained
                ):
                    continue
            key = incident_key(inc.to_event(run_id=self.run_id, node=self.node))
            if key in self.raised or not self._claim(key):
                self.raised.add(key)
                continue
            self.raised.add(key)
            ev = self._routed(inc).to_event(run_id=self.run_id, node=self.node, attempt=self.attempt())
            self._write(ev)
            new.append(ev)
            self.events.append(ev)
        return tuple(new)

    def _routed(self, inc: Incident) -> Incident:
        """A new incident that asks to route around an HCA of this node, with the environment change
        the next attempt takes (or, when no path is left, the drain it needs instead)."""
        if inc.action != "route_around_hca" or inc.blast_radius.nodes != (self.node,):
            return inc
        try:
            routed = route_incident(inc, inc.subject, {**self._job_env, **self._route})
        except ConfigError as exc:  # the evidence names no HCA this can exclude
            return dataclasses.replace(
                inc,
                action="drain_check_link",
                evidence=(*inc.evidence, f"cannot route around: {exc.message}"),
            )
        self._route.update(routed.env)
        return routed

    def route_env(self) -> dict[str, str]:
        """The environment changes this node's next workers take (empty until a link is routed around)."""
        with self._lock:
            return dict(self._route)

    def refresh(self) -> tuple[IncidentRaised, ...]:
        """One round now, never raising: the thread's rounds, and the agent's before a restart (a
        failure just detected is diagnosed, and its route-around applies to the very next attempt)."""
        try:
            with self._lock:
                return self.poll()
        except Exception as exc:  # noqa: BLE001 - the collector must never take the job down
            msg = f"diagnosis round failed: {type(exc).__name__}: {exc}"
            if msg not in self.errors:
                self.errors.append(msg)
            return ()

    def _source_failed(self, what: str, exc: Exception, now: float) -> Incident:
        """Watching the watchers: a collector source that fails is an incident (raised once per
        distinct error; ``onset`` is when that error was first seen)."""
        msg = getattr(exc, "message", None) or str(exc)
        first = self._failing.setdefault(msg, now)
        if msg not in self.errors:
            self.errors.append(msg)
        return Incident(
            cause=f"{what} on {self.node} cannot be read ({msg}); what it watches is unobserved",
            fault_class=FaultClass.SYSTEM,
            component=Component.COLLECTOR,
            confidence=0.9,
            action="fix_collector_source",
            ts=now,
            onset=first,
            rule="policy:collector-error",
            evidence=(f"{what}: {msg}",),
            blast_radius=BlastRadius(nodes=(self.node,)),
        )

    def _claim(self, key: str) -> bool:
        self._claims.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = hashlib.sha256(key.encode()).hexdigest()[:24]
        try:
            fd = os.open(self._claims / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return False
        os.write(fd, key.encode()[:4096])
        os.close(fd)
        return True

    def _write(self, ev: IncidentRaised) -> None:
        if self._writer is None:
            path = self.run.ledger / f"diagnosis-{self.node}-{os.getpid()}.ledger"
            self._writer = LedgerWriter(path, writer=f"diagnosis {self.node}")
        try:
            self._writer.append(ev)
        except StalwartError as exc:
            self.errors.append(exc.message)
        self.notify(ev)

    # --- thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.src.interval_s):
            self.refresh()

    def start(self) -> LiveDiagnosis:
        self._thread = threading.Thread(target=self._run, name="stalwart-diagnosis", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, then one last round so a failure at the very end is still diagnosed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._thread is None or not self._thread.is_alive():
            try:
                with self._lock:
                    new = self.poll(final=True)
                if self.topology is not None and node_faults(new):
                    # other agents may be raising their nodes' faults right now: one more look, so a
                    # shared cause is seen even when every node stops at once
                    time.sleep(min(self.src.interval_s, 2.0))
                    with self._lock:
                        self.poll(final=True)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        if self._writer is not None:
            self._writer.close()
