"""``stalwart plan``: checkpoint interval per tier, spares, restart strategy, ETTR and cost at scale."""

from __future__ import annotations

import json
from pathlib import Path

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
        from ..sim.config import make_config
        from ..sim.measured import config_from_ledger
        from ..sim.planner import plan

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
        if ledger is not None:
            cfg, notes = config_from_ledger(ledger, cfg)
        result = plan(cfg, scale_to=scale_to, trials=trials)
        written = []
        if plot is not None:
            from ..sim.plots import write_plots

            written = [str(p) for p in write_plots(result, plot, plot_format)]
        data = result.as_dict()
        data["notes"] = list(data["notes"]) + notes
        data["plots"] = written
        if json_out:
            print(json.dumps(data, indent=2, default=str))
            return
        _print(data)


def _print(d: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    t = Table(title="checkpoint interval per tier")
    for col in ("tier", "current s", "Daly s", "recommended s", "why"):
        t.add_column(col)
    for a in d["tiers"]:
        t.add_row(
            a["name"],
            f"{a['current_s']:,.0f}",
            f"{a['closed_form_s']:,.0f}",
            f"{a['recommended_s']:,.0f}",
            a["reason"],
        )
    c.print(t)
    c.print(f"[bold]spares:[/bold] {d['spares']['value']}  -  {d['spares']['reason']}")
    c.print(f"[bold]restart strategy:[/bold] {d['strategy']['value']}  -  {d['strategy']['reason']}")
    s = Table(title="predicted at scale (interval re-optimised, spares scaled with the fleet)")
    for col in (
        "GPUs",
        "spares",
        "job MTBF h",
        "interval s",
        "ETTR mean",
        "ETTR p5",
        "interruptions",
        "lost GPU-h",
        "cost",
    ):
        s.add_column(col, justify="right")
    for p in d["scale"]:
        s.add_row(
            f"{p['gpus']:,}",
            "pool" if p["spare_nodes"] is None else str(p["spare_nodes"]),
            f"{p['job_mtbf_h']:.2f}",
            f"{p['interval_s']:,.0f}",
            f"{p['ettr_mean']:.3f}",
            f"{p['ettr_p5']:.3f}",
            f"{p['interruptions_mean']:,.0f}",
            f"{p['lost_gpu_hours_mean']:,.0f}",
            f"{p['cost_mean']:,.0f}",
        )
    c.print(s)
    for n in d["notes"]:
        c.print(f"note: {n}")
    for p in d["plots"]:
        c.print(f"wrote {p}")
