"""``stalwart plan``: checkpoint interval per tier, spares, restart strategy, ETTR and cost at scale."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Literal, get_origin

import numpy as np
import typer

from ..checkpoint import advisor
from ..errors import ConfigError
from ..events import ChaosInjected
from ..ledger import read_merged
from ._plan_view import _print, compact  # noqa: F401  (compact: the tables' numbers, tested here)
from .sim import build_values, load_config_file

KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
CRASH_DETECT_S = 60.0  # failure classes detected within this are revealed by a crash, not a timeout


def _software_crash(f) -> bool:
    """A failure class a process crash reveals: it keeps the node, and no timeout detects it."""
    return not f.node_loss and f.detect_s <= CRASH_DETECT_S


# Any: a flag's Python type, and typer.Option, which typer declares as returning Any
_OPTIONS: list[tuple[str, Any, Any]] = [  # (name, type, typer.Option): the command's own flags
    ("gpus", int, typer.Option(None, help="GPUs in the job (default 16384).")),
    ("gpus_per_node", int, typer.Option(None, help="GPUs per node (default 8).")),
    ("days", float, typer.Option(None, help="Wall-clock length of the run in days (default 54).")),
    ("trials", int, typer.Option(200, help="Monte Carlo trials per candidate.")),
    ("seed", int, typer.Option(None, help="Random seed.")),
    ("interval", float, typer.Option(None, help="Current checkpoint interval, s (single tier).")),
    (
        "stall",
        float,
        typer.Option(None, help="Checkpoint stall, s (single tier; flat times, no target job)."),
    ),
    ("restart", float, typer.Option(None, help="Restart time, s (flat times at every size, no target job).")),
    ("rate_scale", float, typer.Option(1.0, help="Multiply every failure rate.")),
    (
        "scale_to",
        list[int],
        typer.Option([], "--scale-to", help="Also predict at this many GPUs (repeatable)."),
    ),
    (
        "ledger",
        Path,
        typer.Option(None, "--ledger", help="Run directory or ledger: measured rates and times."),
    ),
    (
        "inplace_phases",
        Path,
        typer.Option(
            None, "--inplace-phases", help="JSON of in-place recovery phases measured per world size."
        ),
    ),
    ("plot", Path, typer.Option(None, "--plot", help="Write charts into this directory.")),
    ("plot_format", str, typer.Option("png", help="png or svg.")),
    ("config", Path, typer.Option(None, help="YAML file of simulator settings.")),
    (
        "faults_are_tests",
        bool,
        typer.Option(
            False,
            "--faults-are-tests",
            help="The --ledger run's failures were tests (a kill by hand): plan with the published "
            "failure rates and use only the run's measured times.",
        ),
    ),
    ("json_out", bool, typer.Option(False, "--json", help="Print JSON instead of tables.")),
]


def _job_parameters() -> list[inspect.Parameter]:
    """The target job's flags, from its schema (``sim/job.py``): help and default from the field."""

    from ..settings.sources import cli_type, leaves  # deferred: heavy (pydantic)
    from ..sim.job import TargetJob  # deferred: heavy (pydantic, yaml)

    out = []
    for leaf in leaves(TargetJob).values():
        kind = str if get_origin(leaf.field.annotation) is Literal else cli_type(leaf)
        d = leaf.field.default
        shown = "" if d is None else f"  [default: {d:g}]" if isinstance(d, float) else f"  [default: {d}]"
        option = typer.Option(
            None, *leaf.setting.flags, help=(leaf.field.description or "") + shown, show_default=False
        )
        out.append(inspect.Parameter(leaf.name, KEYWORD_ONLY, default=option, annotation=kind))
    return out


def register(app: typer.Typer) -> None:
    def plan_cmd(**given: Any) -> None:  # Any: typer passes each option's value, each of its own type
        """Recommend checkpoint intervals, hot spares and a recovery option; predict ETTR at scale."""
        from ..sim.job import TargetJob  # deferred: heavy (pydantic, yaml)

        job = {k: given.pop(k) for k in TargetJob.model_fields if k in given}
        _plan(job={k: v for k, v in job.items() if v is not None}, **given)

    plan_cmd.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, KEYWORD_ONLY, default=o, annotation=t) for n, t, o in _OPTIONS]
        + _job_parameters()
    )
    app.command("plan")(plan_cmd)


def _plan(
    *,
    gpus,
    gpus_per_node,
    days,
    trials,
    seed,
    interval,
    stall,
    restart,
    rate_scale,
    scale_to,
    ledger,
    inplace_phases,
    plot,
    plot_format,
    config,
    faults_are_tests,
    json_out,
    job,
) -> None:
    from ..sim.alloc import keep_freed_memory  # deferred: heavy (pydantic, yaml)
    from ..sim.config import MAX_GPUS, make_config  # deferred: heavy (pydantic, yaml)
    from ..sim.planner import plan  # deferred: heavy (pydantic, yaml)

    keep_freed_memory()
    if plot_format not in ("png", "svg"):
        raise ConfigError(f"unknown plot format {plot_format!r}", "use png or svg")
    for g in scale_to:
        if not 0 < g <= MAX_GPUS:
            raise ConfigError(f"--scale-to must be a number of GPUs in 1..{MAX_GPUS:,}, got {g}")
    values = build_values(
        load_config_file(config),
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        days=days,
        trials=trials,
        seed=seed,
        interval=interval,
        stall=stall,
        restore=None,
        restart=restart,
        strategy=None,
        spares=None,
        elastic=None,
        rate_scale=rate_scale,
        price=None,
    )
    cfg = make_config(**values)
    flat = restart is not None or stall is not None  # the user's own times, at every size
    notes: list[str] = []
    measured = None
    events = None
    rates = None
    if ledger is not None:
        events = read_merged(ledger)
        measured = _replay(events, values, trials, notes)
        cfg, fitted, rates = _fitted(events, cfg, flat, faults_are_tests)
        notes += fitted
        if interval is None and measured and measured["interval_s"] and len(cfg.tiers) == 1:
            tier = {**cfg.tiers[0].model_dump(), "interval_s": measured["interval_s"]}
            cfg = make_config(**{**cfg.model_dump(), "tiers": [tier]})
            notes.append("current checkpoint interval: the run's own (median between commits)")
    target = None if flat else _target(job, events, measured, inplace_phases, cfg, notes)
    if rates is not None:
        from ..sim.fit import check_feasible  # deferred: heavy (pydantic, yaml)

        source = str(rates.source)
        check_feasible(cfg, source)
        if target is not None:  # and with the target job's own recoveries: refused if none keeps up
            from ..sim.options import OPTIONS  # deferred: heavy (pydantic, yaml)

            refusals = []
            for opt in OPTIONS:
                try:
                    check_feasible(target.config(cfg, opt), source)
                except ConfigError as exc:
                    refusals.append(exc)
            if len(refusals) == len(OPTIONS):
                raise refusals[0]
    result = plan(cfg, scale_to=scale_to, trials=trials, target=target)
    written = []
    if plot is not None:
        from ..sim.plots import write_plots  # deferred: heavy (pydantic, yaml)

        written = [str(p) for p in write_plots(result, plot, plot_format)]
    data = result.as_dict()
    data["notes"] = [*result.notes, *notes]
    data["rates"] = {"source": str(rates.source), "reason": rates.reason} if rates is not None else None
    data["plots"] = written
    data["measured"] = measured
    if json_out:
        print(json.dumps(data, indent=2, default=str))
        return
    _print(data)


def _target(job: dict, events, measured: dict | None, inplace: Path | None, cfg, notes: list[str]):
    """The job planned for and its phase laws: the run's own phases where they do not grow with the job,
    the published figures at scale where they do."""
    from pydantic import ValidationError  # deferred: heavy (pydantic)

    from ..sim.job import TargetJob  # deferred: heavy (pydantic, yaml)
    from ..sim.options import Target  # deferred: heavy (pydantic, yaml)

    # deferred: heavy (pydantic, yaml)
    from ..sim.phases import Measured, build_laws, load_inplace, measured_from_events
    from ..sim.units import duration  # deferred: heavy (pydantic, yaml)

    try:
        spec = TargetJob(**job)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = "--" + str(first.get("loc", ("job",))[0]).replace("_", "-")
        raise ConfigError(
            f"invalid {flag}: {first.get('msg')} (got {first.get('input')!r})", "see stalwart plan --help"
        ) from None
    m = None
    if events is not None and measured is not None:
        m = measured_from_events(events, int(measured["gpus"]))
        if measured.get("recover_s") is not None and cfg.gpus != measured["gpus"]:
            notes.append(
                f"the run's restart ({duration(measured['recover_s'])} at {measured['gpus']} ranks) is not "
                f"the job's at {cfg.gpus:,} GPUs: what does not grow with the job is used as measured, "
                "the rest follows its law (the phases table says which)"
            )
    if inplace is not None:
        table = load_inplace(inplace)
        m = Measured(
            ranks=m.ranks if m else 1,
            paths=m.paths if m else {},
            step_s=m.step_s if m else None,
            inplace=table,
        )
        notes.append(f"in-place phases measured at {', '.join(str(r) for r in sorted(table))} ranks")
    target = Target(spec, build_laws(m))
    notes.extend(target.laws.notes)
    return target


def _measured(events, base, flat: bool = True, faults_are_tests: bool = False, force_published: str = ""):
    """The simulator fitted to a run: its measured times, and its failure rate only where its failures
    are evidence of one (``sim/evidence.py``). Injected faults are not a rate: a short chaos run
    extrapolated per second predicts hundreds of millions of interruptions at scale. Returns the config,
    the notes and the rates' source with its reason."""
    from ..sim.config import make_config  # deferred: heavy (pydantic, yaml)
    from ..sim.measured import config_from_events  # deferred: heavy (pydantic, yaml)

    fitted = config_from_events(
        events, base, faults_are_tests=faults_are_tests, force_published=force_published
    )
    cfg, notes = fitted.cfg, fitted.notes
    injected = sum(1 for e in events if isinstance(e, ChaosInjected))
    if injected and not flat:
        # the run measured how fast its agent sees an injected crash: at scale that still holds for the
        # classes a software crash reveals; a hardware fault (an XID, a lost node, a hang until a
        # timeout, silent corruption) surfaces by other means the run did not measure: their defaults
        values = cfg.model_dump()
        values["failures"] = [
            {**m.model_dump(), "detect_s": m.detect_s if _software_crash(f) else f.detect_s}
            for f, m in zip(base.failures, cfg.failures, strict=True)
        ]
        cfg = make_config(**values)
        notes = [n for n in notes if not n.startswith(("restart ", "checkpoint stall", "detection latency"))]
        notes.append(
            "detection: the measured crash detection for software crashes; hardware faults and "
            "classes detected by a timeout keep their default detection"
        )
    return cfg, notes, fitted.rates


def _fitted(events, base, flat: bool, faults_are_tests: bool):
    """:func:`_measured`, falling back to the published rates when the run's own rate would leave a job
    of the planned size no time to train (said in a note, never an error: the run itself finished)."""
    from ..sim.evidence import RateSource  # deferred: heavy (pydantic, yaml)
    from ..sim.fit import check_feasible  # deferred: heavy (pydantic, yaml)

    cfg, notes, rates = _measured(events, base, flat, faults_are_tests)
    if rates.source is not RateSource.MEASURED:
        return cfg, notes, rates
    try:
        check_feasible(cfg, "measured")
    except ConfigError as exc:
        why = (
            f"{exc.message}; planned with the published failure rates instead (fix what failed in the "
            "run before scaling it up)"
        )
        return _measured(events, base, flat, faults_are_tests, force_published=why)
    return cfg, notes, rates


def _replay(events, values: dict, trials: int, notes: list[str]) -> dict | None:
    """Fit the run in the ledger (rates per node-hour with 95% bounds, times) and simulate that run
    itself: the prediction to compare with what the report measured. None, with a note, when there is
    nothing to replay (no failure) or the fitted run could not have trained (a rate that leaves no time
    to recover): the plan goes on without it."""
    from ..sim import simulate  # deferred: heavy (pydantic, yaml)
    from ..sim.buckets import to_report  # deferred: heavy (pydantic, yaml)
    from ..sim.config import make_config  # deferred: heavy (pydantic, yaml)
    from ..sim.fit import check_feasible, fit_run, run_config  # deferred: heavy (pydantic, yaml)

    fit = fit_run(events)
    if fit.failures == 0:
        notes.append("the run had no failure: nothing to replay, so no predicted-vs-measured goodput")
        return None
    cfg = make_config(**run_config(fit, values, trials))
    try:
        check_feasible(cfg, "measured")
    except ConfigError as exc:
        notes.append(f"the run's own replay is skipped: {exc.message}")
        return None
    r = simulate(cfg)
    rate, low, high = fit.per_node_hour
    # the simulated horizon ends at the last step; the run's shutdown (final save, exit) is added back
    predicted = to_report({b: float(a.mean()) for b, a in r.buckets.items()})
    predicted["shutdown"] += fit.buckets.get("shutdown", 0.0)
    ettr = r.buckets["productive"] / fit.wall_s
    return {
        "gpus": fit.gpus,
        "wall_s": fit.wall_s,
        "node_hours": fit.node_hours,
        "injected": fit.injected,
        "failures": fit.failures,
        "per_node_hour": rate,
        "per_node_hour_95": [low, high],
        "classes": [c.__dict__ for c in fit.classes],
        "recover_s": fit.recover_s,
        "recover_paths": [
            {"path": p.path, "count": p.count, "recover_s": p.recover_s, "phases": p.phases}
            for p in fit.recover_paths
        ],
        "stall_s": fit.stall_s,
        "interval_s": fit.interval_s,
        "goodput_measured": fit.goodput,
        "goodput_predicted": float(ettr.mean()),
        "goodput_predicted_p5_p95": [float(q) for q in np.percentile(ettr, [5, 95])],
        "auto_interval": _auto_interval(events),
        "buckets_measured_s": fit.buckets,
        "buckets_predicted_s": predicted,
    }


def _auto_interval(events) -> dict | None:
    """What ``--checkpoint-every auto`` chooses for this run (the same decision as a live run's,
    ``checkpoint/advisor.py: recommend_from_ledger``); None where that function or the inputs are
    missing (no checkpoint staged)."""

    recommend = getattr(advisor, "recommend_from_ledger", None)
    choice = recommend(events) if recommend is not None else None
    if choice is None:
        return None
    return {"steps": choice.steps, "interval_s": choice.interval_s, "reason": choice.reason}
