"""``stalwart plan``: checkpoint interval per tier, spares, restart strategy, ETTR and cost at scale."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer

from .sim import build_values, load_config_file


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        gpus: int = typer.Option(None, help="GPUs in the job (default 16384)."),
        gpus_per_node: int = typer.Option(None, help="GPUs per node (default 8)."),
        days: float = typer.Option(None, help="Wall-clock length of the run in days (default 54)."),
        trials: int = typer.Option(200, help="Monte Carlo trials per candidate."),
        seed: int = typer.Option(None, help="Random seed."),
        interval: float = typer.Option(None, help="Current checkpoint interval, s (single tier)."),
        stall: float = typer.Option(None, help="Checkpoint stall, s (single tier)."),
        restart: float = typer.Option(None, help="In-job restart time, s."),
        rate_scale: float = typer.Option(1.0, help="Multiply every failure rate."),
        scale_to: list[int] = typer.Option(
            [], "--scale-to", help="Also predict at this many GPUs (repeatable)."
        ),
        ledger: Path = typer.Option(
            None, "--ledger", help="Run directory or ledger: measured rates and times."
        ),
        plot: Path = typer.Option(None, "--plot", help="Write charts into this directory."),
        plot_format: str = typer.Option("png", help="png or svg."),
        config: Path = typer.Option(None, help="YAML file of simulator settings."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    ) -> None:
        """Recommend checkpoint intervals, hot spares and a restart strategy; predict ETTR at scale."""
        from ..errors import ConfigError
        from ..sim.alloc import keep_freed_memory
        from ..sim.config import make_config
        from ..sim.planner import plan

        keep_freed_memory()

        if plot_format not in ("png", "svg"):
            raise ConfigError(f"unknown plot format {plot_format!r}", "use png or svg")
        from ..sim.config import MAX_GPUS

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
        notes: list[str] = []
        measured = None
        if ledger is not None:
            measured = _replay(ledger, values, trials)
            cfg, notes = _measured(ledger, cfg)
            if interval is None and measured["interval_s"] and len(cfg.tiers) == 1:
                tier = {**cfg.tiers[0].model_dump(), "interval_s": measured["interval_s"]}
                cfg = make_config(**{**cfg.model_dump(), "tiers": [tier]})
                notes.append("current checkpoint interval: the run's own (median between commits)")
            from ..sim.fit import check_feasible

            check_feasible(cfg, "measured" if not measured["injected"] else "default")
        result = plan(cfg, scale_to=scale_to, trials=trials)
        written = []
        if plot is not None:
            from ..sim.plots import write_plots

            written = [str(p) for p in write_plots(result, plot, plot_format)]
        data = result.as_dict()
        data["notes"] = [*result.notes, *notes]
        data["plots"] = written
        data["measured"] = measured
        if json_out:
            print(json.dumps(data, indent=2, default=str))
            return
        _print(data)


def _measured(ledger: Path, base):
    """The simulator fitted to a run. Failures that chaos injected are not a failure rate: a short chaos
    run extrapolated per second predicts hundreds of millions of interruptions at scale. For such a run
    keep the default rates and use only the measured times (detection, restart, checkpoint stall)."""
    from ..events import ChaosInjected
    from ..ledger import read_merged
    from ..sim.config import make_config
    from ..sim.measured import config_from_events

    events = read_merged(ledger)
    cfg, notes = config_from_events(events, base)
    injected = sum(1 for e in events if isinstance(e, ChaosInjected))
    if injected and cfg.failures != base.failures:
        values = cfg.model_dump()
        values["failures"] = [
            {**f.model_dump(), "detect_s": m.detect_s}
            for f, m in zip(base.failures, cfg.failures, strict=True)
        ]
        cfg = make_config(**values)
        notes = [n for n in notes if not n.startswith("failure rate")]
        notes.insert(
            0,
            f"{injected} fault(s) in this run were injected by chaos, so its failure rate says nothing "
            "about a real fleet: default failure rates kept; measured times used",
        )
    return cfg, notes


def _replay(ledger: Path, values: dict, trials: int) -> dict:
    """Fit the run in ``ledger`` (rates per node-hour with 95% bounds, times) and simulate that run
    itself: the prediction to compare with what the report measured."""
    from ..errors import LedgerError
    from ..ledger import read_merged
    from ..sim import simulate
    from ..sim.buckets import to_report
    from ..sim.config import make_config
    from ..sim.fit import check_feasible, fit_run, run_config

    fit = fit_run(read_merged(ledger))
    if fit.failures == 0:
        raise LedgerError(
            f"the run in {ledger} had no failure, so there is no failure rate to fit",
            "plan without --ledger (default fleet rates), or point at a run that had failures",
        )
    cfg = make_config(**run_config(fit, values, trials))
    check_feasible(cfg, "measured")
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
        "buckets_measured_s": fit.buckets,
        "buckets_predicted_s": predicted,
    }


def compact(x: float) -> str:
    """A count short enough for an 80-column table: 99,999 as is, then 123k, 4.5M, 1.2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M")):
        if abs(x) >= scale:
            return f"{x / scale:,.1f}{suffix}"
    return f"{x / 1e3:.0f}k" if abs(x) >= 1e5 else f"{x:,.0f}"


def _print(d: dict) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    c = Console(highlight=False)

    def say(text: str) -> None:  # prose: wrapped at the terminal's width (80 when not a terminal)
        c.print(text)

    def table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
        # no vertical rules, each column as wide as its widest value: numbers are never cut at 80 columns
        t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        for i, h in enumerate(headers):
            width = max([len(r[i]) for r in rows] + [max(len(x) for x in h.split("\n"))])
            t.add_column(
                h, justify="left" if i == 0 else "right", overflow="fold", min_width=width, no_wrap=True
            )
        for r in rows:
            t.add_row(*r)
        return t

    from ..sim.units import duration, number, percent

    m = d.get("measured")
    if m:
        say(
            f"[bold]measured run:[/bold] {m['gpus']:,} GPUs for {duration(m['wall_s'])} "
            f"({number(m['node_hours'])} node-hours{' of training' if m['injected'] else ''}), "
            f"{m['failures']} failures" + (f", {m['injected']} injected by chaos" if m["injected"] else "")
        )
        rows = [
            [
                k["name"],
                str(k["events"]),
                number(k["per_node_hour"]),
                f"{number(k['low'])} - {number(k['high'])}",
                duration(k["detect_s"]),
            ]
            for k in m["classes"]
        ]
        lo, hi = m["per_node_hour_95"]
        rows.append(
            ["all", str(m["failures"]), number(m["per_node_hour"]), f"{number(lo)} - {number(hi)}", ""]
        )
        c.print(
            table(
                "failure rates fitted per node-hour (95% Poisson bounds)",
                ["failure", "count", "per\nnode-h", "95% bounds", "detect"],
                rows,
            )
        )
        paths = m.get("recover_paths") or []
        if paths:
            total = sum(p["count"] for p in paths)
            rows = [
                [p["path"], str(p["count"]), percent(p["count"] / total), duration(p["recover_s"])]
                for p in paths
            ]
            if m["recover_s"] is not None:
                rows.append(["all (the simulated mean)", "", "", duration(m["recover_s"])])
            c.print(
                table(
                    "recovery per path (restart decision -> first step)",
                    ["path", "count", "share", "mean"],
                    rows,
                )
            )
        p5, p95 = m["goodput_predicted_p5_p95"]
        say(
            f"goodput: measured {percent(m['goodput_measured'])}, simulated from the fitted rates and "
            f"times {percent(m['goodput_predicted'])} (5-95%: {percent(p5)} - {percent(p95)})"
        )
        wall = m["wall_s"] or 1.0
        rows = [
            [b, percent(m["buckets_measured_s"].get(b, 0.0) / wall), percent(v / wall)]
            for b, v in m["buckets_predicted_s"].items()
            if v > 0 or m["buckets_measured_s"].get(b, 0.0) > 0
        ]
        c.print(
            table(
                "this run: measured and simulated, share of wall time",
                ["bucket", "measured", "simulated"],
                rows,
            )
        )
    rows = [
        [a["name"], duration(a["current_s"]), duration(a["closed_form_s"]), duration(a["recommended_s"])]
        for a in d["tiers"]
    ]
    c.print(table("checkpoint interval per tier", ["tier", "current", "Daly", "recommended"], rows))
    for a in d["tiers"]:
        say(f"why: {a['reason']}")
    say(f"[bold]spares:[/bold] {d['spares']['value']}  -  {d['spares']['reason']}")
    say(f"[bold]restart strategy:[/bold] {d['strategy']['value']}  -  {d['strategy']['reason']}")
    rows = [
        [
            f"{p['gpus']:,}",
            "pool" if p["spare_nodes"] is None else str(p["spare_nodes"]),
            duration(p["job_mtbf_h"] * 3600.0),
            duration(p["interval_s"]),
            percent(p["ettr_mean"]),
            percent(p["ettr_p5"]),
            compact(p["interruptions_mean"]),
            compact(p["lost_gpu_hours_mean"]),
            compact(p["cost_mean"]),
        ]
        for p in d["scale"]
    ]
    c.print(
        table(
            "predicted at scale",
            [
                "GPUs",
                "spares",
                "job\nMTBF",
                "ckpt\nevery",
                "ETTR\nmean",
                "ETTR\np5",
                "inter-\nrupts",
                "lost\nGPU-h",
                "cost",
            ],
            rows,
        )
    )
    say(
        "(interval re-optimised and spares re-chosen at each size for the most productive GPU-hours per "
        "reserved GPU-hour; job MTBF: the job's mean time between failures; ckpt every: checkpoint "
        "interval; cost: of the lost GPU-hours and the spares; k/M/B: thousands, millions, billions)"
    )
    for p in d["scale"]:
        if p.get("wait_share", 0.0) >= 0.0005:
            say(
                f"(at {p['gpus']:,} GPUs the job waits {percent(p['wait_share'])} of the time for a "
                f"repaired node: all {p['spare_nodes']} spares are in repair; the larger spare counts "
                "tried cost more GPU-hours than they save)"
            )
    opts = d.get("options") or []
    if opts:
        from ..sim.planner import OPTIONS

        sizes = sorted({o["gpus"] for o in opts})
        by = {(o["option"], o["gpus"]): o for o in opts}
        rows = [[name] + [percent(by[(name, g)]["ettr"]) for g in sizes] for name in OPTIONS]
        c.print(table("ETTR by recovery option and GPUs", ["option"] + [compact(g) for g in sizes], rows))
        say(
            "(same failures for every option; cold: restart every process, restore from storage; warm: "
            "restart in place (never slower than cold); peer: restore from a healthy peer's memory; "
            "replica: the failed replica group drops out and rejoins while the others train; hot_spares: "
            "pre-initialised spare nodes (at least 1 per 256) step in; elastic: no spares, shrink instead "
            "of waiting for a repaired node, so it trains on fewer GPUs but reserves none)"
        )
    for n in d["notes"]:
        say(f"note: {n}")
    for p in d["plots"]:
        say(f"wrote {p}")
