"""Recovery phases at the target size: each from its law (``sim/laws.py``) and its sources.

Inputs: what Stalwart measured (a run's ledger: its recoveries' phases by path, at the run's world
size; the in-place recovery benchmark: its phases at several world sizes, ``inplace-phases.json``),
and the published GPU-cluster figures in :data:`PUBLISHED` (cited in docs/simulator.md). A measured
figure stands as it is only for a phase that does not grow with the job; a phase that grows takes a
law through the measured figures and a published one at scale.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..account.recovery import recoveries
from ..errors import ConfigError
from ..events import Event, StepCompleted
from .laws import Growth, Law, Point, Source

# Published figures at GPU-cluster scale: (ranks, seconds, citation). docs/simulator.md quotes them.
NVRX = "NVRx in-process restart docs"
PUBLISHED: dict[str, tuple[int, float, str]] = {
    # NVRx in-process restart: TCPStore barrier 0.5 s and rank assignment 0.5 s at 16k ranks
    "rendezvous": (16_384, 1.0, f"{NVRX}: store barrier 0.5 s + rank assignment 0.5 s"),
    # NVRx: destroy_process_group ~0.5 s at 16k ranks
    "abort": (16_384, 0.5, f"{NVRX}: process-group destroy"),
    # NCCLX (Meta, arXiv 2510.20171): stock NCCL's bootstrap and connection set-up, ~265 s at 96k GPUs
    "pg_init": (96_000, 265.0, "NCCLX, arXiv 2510.20171: stock NCCL init"),
}
# at one rank there is nobody to wait for and no peer to connect to: the laws' lower anchor
ALONE = "one rank has no peer (lower bound)"

# Defaults where neither a measurement nor a publication gives the figure (docs/simulator.md)
DEFAULTS: dict[str, tuple[float, str]] = {
    "tear_down": (2.0, "stop every worker (our assumption)"),
    "spawn": (30.0, "start a process: import torch and the framework, build the model (our assumption)"),
    "fork": (2.0, "fork a pre-imported worker (our assumption)"),
    "first_step_ratio": (2.0, "the first step takes two steps' time (our assumption)"),
}


@dataclass(frozen=True)
class Measured:
    """What a small run measured: its recoveries' mean phases by path (``warm``, ``cold``) at
    ``ranks`` ranks, and its median step (for the first step's ratio)."""

    ranks: int
    paths: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    step_s: float | None = None
    inplace: Mapping[int, Mapping[str, float]] = field(default_factory=dict)  # ranks -> phases

    def phase(self, path: str, name: str) -> float | None:
        return self.paths.get(path, {}).get(name)


def measured_from_events(events: Sequence[Event], ranks: int) -> Measured:
    """The mean of each recovery phase per path (warm, cold) over the ledger's recoveries."""
    rows: dict[str, list[dict[str, float]]] = {}
    for r in recoveries(list(events)):
        if r.path in ("warm", "cold") and all(v is not None for v in r.phases.values()):
            rows.setdefault(r.path, []).append({k: float(v or 0.0) for k, v in r.phases.items()})
    paths = {
        path: {k: statistics.fmean(row[k] for row in group) for k in group[0]} for path, group in rows.items()
    }
    steps = [e.duration for e in events if isinstance(e, StepCompleted) and e.rank <= 0 and e.duration > 0]
    return Measured(ranks, paths, statistics.median(steps) if steps else None)


INPLACE_FIELDS = ("detect_s", "abort_s", "rendezvous_s", "pg_init_s", "transfer_s", "first_step_s")


def load_inplace(path: str | Path) -> dict[int, dict[str, float]]:
    """Measured in-place recovery phases by world size from a JSON file of the form
    ``{"ranks": {"2": {"detect_s": .., "abort_s": .., ...}, ...}}``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read in-place phases from {path}: {exc}") from None
    table = data.get("ranks") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{path}: no 'ranks' table of phases", 'expected {"ranks": {"2": {...}, ...}}')
    out: dict[int, dict[str, float]] = {}
    for key, row in table.items():
        if not (str(key).isdigit() and int(key) >= 1 and isinstance(row, dict)):
            raise ConfigError(f"{path}: {key!r} is not a world size with a table of phases")
        vals = {k: row.get(k) for k in INPLACE_FIELDS if row.get(k) is not None}
        for k, v in list(vals.items()) + [(k, row.get(k)) for k in ("bytes_moved", "state_bytes")]:
            if v is None:
                continue
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"{path}: {k} at {key} ranks is {v!r}, not a non-negative number")
            vals[k] = float(v)
        out[int(key)] = vals  # type: ignore[assignment]
    return out


def _published(phase: str) -> Point:
    ranks, value, cite = PUBLISHED[phase]
    return Point(ranks, value, Source.PUBLISHED, cite)


def _constant(phase: str, measured: float | None, ranks: int, what: str) -> Law:
    """A phase that does not grow with the job: the measured figure as it is, else the default."""
    if measured is not None:
        return Law(phase, Growth.CONSTANT, (Point(ranks, measured, Source.MEASURED, what),))
    value, why = DEFAULTS[phase]
    return Law(phase, Growth.CONSTANT, (Point(1, value, Source.DEFAULT, why),))


def _growing(phase: str, measured: Mapping[int, float], what: str, published: str | None = None) -> Law:
    """A phase that grows with the ranks: the measured figures, the published one at scale, and the
    lower anchor at one rank."""
    pts = [Point(1, 0.0, Source.DEFAULT, ALONE)]
    pts += [Point(r, v, Source.MEASURED, what) for r, v in sorted(measured.items())]
    pts.append(_published(published or phase))
    return Law(phase, Growth.RANKS, tuple(pts))


@dataclass(frozen=True)
class Laws:
    """Every phase's law, from one measured run (or none) and the published figures."""

    tear_down: Law
    spawn: Law
    fork: Law
    rendezvous: Law
    pg_init: Law
    abort: Law
    inplace_rendezvous: Law
    inplace_pg_init: Law
    first_step_ratio: Law
    notes: tuple[str, ...] = ()

    def all(self) -> dict[str, Law]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, Law)}


def build_laws(m: Measured | None) -> Laws:
    """The laws: constant phases from the run as measured, growing ones through the published figures.
    (Detection is per failure class, in the simulator's configuration: ``commands/plan.py``.)"""
    ranks = m.ranks if m is not None else 1
    cold = (m.paths.get("cold") if m is not None else None) or {}
    warm = (m.paths.get("warm") if m is not None else None) or {}
    any_path = warm or cold
    run = f"{ranks}-rank run (ledger)"
    notes = []
    tear = None if not any_path else any_path.get("tear_down", 0.0) + any_path.get("decide", 0.0)
    # a cold start's re-form and load are the process start: imports, model build; at the measured
    # size they include a process group of that size and a small checkpoint, the law adds those at scale
    spawn = None if not cold else cold.get("re_form", 0.0) + cold.get("load", 0.0)
    fork = None if not warm else warm.get("re_form", 0.0) + warm.get("load", 0.0)
    ratio = None
    first = any_path.get("first_step") if any_path else None
    if first is not None and m is not None and m.step_s:
        ratio = max(first / m.step_s, 1.0)
    inplace = m.inplace if m is not None else {}
    bench = "in-place benchmark"
    if m is not None and not inplace:
        notes.append("no in-place measurements: the in-place phases come from the published figures alone")
    return Laws(
        tear_down=_constant("tear_down", tear, ranks, run),
        spawn=_constant("spawn", spawn, ranks, run),
        fork=_constant("fork", fork, ranks, run),
        rendezvous=_growing("rendezvous", {}, run),
        pg_init=_growing("pg_init", {}, run),
        abort=_growing("abort", {r: p["abort_s"] for r, p in inplace.items() if "abort_s" in p}, bench),
        inplace_rendezvous=_growing(
            "rendezvous", {r: p["rendezvous_s"] for r, p in inplace.items() if "rendezvous_s" in p}, bench
        ),
        inplace_pg_init=_growing(
            "pg_init", {r: p["pg_init_s"] for r, p in inplace.items() if "pg_init_s" in p}, bench
        ),
        first_step_ratio=_constant("first_step_ratio", ratio, ranks, f"{run}: first step / median step"),
        notes=tuple(notes),
    )
