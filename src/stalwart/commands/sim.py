"""``stalwart sim``: Monte Carlo of a training run on N GPUs (ETTR, interruptions, lost GPU-hours, cost)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from ..errors import ConfigError
from ..inputs import parse_yaml, read_text_file
from ..terminal import console as terminal_console
from ..terminal import plural, say


# Any: yaml.safe_load returns untyped data; SimConfig validates it
def load_config_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}

    data = parse_yaml(read_text_file(path, 1 << 20, "simulator config"), f"simulator config {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"simulator config {path} must be a mapping of settings")
    return data


def build_values(
    file_values: dict[str, Any],  # Any: settings as parsed from YAML; SimConfig validates them
    *,
    gpus: int | None,
    gpus_per_node: int | None,
    days: float | None,
    trials: int | None,
    seed: int | None,
    interval: float | None,
    stall: float | None,
    restore: float | None,
    restart: float | None,
    strategy: str | None,
    spares: int | None,
    elastic: bool | None,
    rate_scale: float,
    price: float | None,
) -> dict[str, Any]:  # Any: the values SimConfig validates
    """Flags override the file; the file overrides the defaults."""
    from ..sim.config import llama3_failure_mix  # deferred: heavy (numpy)

    if not 0 <= rate_scale < float("inf"):
        raise ConfigError(f"--rate-scale must be a finite non-negative number, got {rate_scale}")
    v = dict(file_values)
    for key, val in (
        ("gpus", gpus),
        ("gpus_per_node", gpus_per_node),
        ("days", days),
        ("trials", trials),
        ("seed", seed),
        ("job_restart_s", restart),
        ("strategy", strategy),
        ("spare_nodes", spares),
        ("elastic", elastic),
        ("gpu_hour_price", price),
    ):
        if val is not None:
            v[key] = val
    if rate_scale != 1.0:
        base = v.get("failures") or [f.model_dump() for f in llama3_failure_mix()]
        v["failures"] = [
            {**dict(f), "per_1000_gpu_days": float(dict(f).get("per_1000_gpu_days", 0)) * rate_scale}
            for f in base
        ]
    if interval is not None or stall is not None or restore is not None:
        tiers = v.get("tiers") or [
            {"name": "shared_fs", "interval_s": 1800.0, "stall_s": 30.0, "restore_s": 300.0}
        ]
        if len(tiers) != 1:
            raise ConfigError(
                "--interval/--stall/--restore set a single tier, but the config file has several",
                "edit the tiers in the config file instead",
            )
        t = dict(tiers[0])
        for key, val in (("interval_s", interval), ("stall_s", stall), ("restore_s", restore)):
            if val is not None:
                t[key] = val
        v["tiers"] = [t]
    return v


def register(app: typer.Typer) -> None:
    @app.command("sim")
    def sim_cmd(
        gpus: int = typer.Option(None, help="GPUs in the job (default 16384, the Llama 3 run)."),
        gpus_per_node: int = typer.Option(None, help="GPUs per node (default 8)."),
        days: float = typer.Option(None, help="Wall-clock length of the run in days (default 54)."),
        trials: int = typer.Option(None, help="Monte Carlo trials (default 1000)."),
        seed: int = typer.Option(None, help="Random seed (default 0)."),
        interval: float = typer.Option(None, help="Checkpoint interval, seconds of training (single tier)."),
        stall: float = typer.Option(None, help="Seconds the loop is blocked per checkpoint (single tier)."),
        restore: float = typer.Option(None, help="Seconds to load the checkpoint on restart (single tier)."),
        restart: float = typer.Option(None, help="Seconds of an in-job restart (rendezvous, init, warm-up)."),
        strategy: str = typer.Option(None, help="in_process | in_job | requeue | replica."),
        spares: int = typer.Option(None, help="Hot spare nodes (default: the pool always has one)."),
        elastic: bool = typer.Option(None, "--elastic/--no-elastic", help="Shrink when no spare is left."),
        rate_scale: float = typer.Option(1.0, help="Multiply every failure rate (1.0 = Llama 3 mix)."),
        price: float = typer.Option(
            None, help="Price of one GPU-hour, in any currency: the cost is in the same one (default 2.0)."
        ),
        config: Path = typer.Option(None, help="YAML file of simulator settings (see docs/simulator.md)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
        write_ledger: Path = typer.Option(
            None, "--write-ledger", help="Write trial 0 as a run directory that 'stalwart report' reads."
        ),
        step: float = typer.Option(10.0, "--step", help="Step time, s, of the written ledger's steps."),
    ) -> None:
        """Simulate a training run with failures: ETTR distribution, interruptions, lost GPU-hours, cost."""
        from ..sim import simulate  # deferred: heavy (numpy)
        from ..sim.alloc import keep_freed_memory  # deferred: heavy (numpy)
        from ..sim.config import make_config  # deferred: heavy (numpy)

        keep_freed_memory()
        values = build_values(
            load_config_file(config),
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            days=days,
            trials=trials,
            seed=seed,
            interval=interval,
            stall=stall,
            restore=restore,
            restart=restart,
            strategy=strategy,
            spares=spares,
            elastic=elastic,
            rate_scale=rate_scale,
            price=price,
        )
        result = simulate(make_config(**values), trace=write_ledger is not None)
        wrote = None
        if write_ledger is not None:
            from ..sim.run_ledger import write  # deferred: heavy (numpy)

            wrote = write(result, write_ledger, step)
        summary = result.summary()
        if json_out:
            print(json.dumps(summary, indent=2))
        else:
            print_summary(summary)
        if wrote is not None:  # on stderr under --json: stdout stays one JSON document
            n, days = int(result.interruptions[0]), result.config.days
            said = (
                f"wrote trial 0 ({plural(n, 'interruption')} in {days:g} day{'s' * (days != 1)}) as a run's "
                f"ledger: {wrote}; read it with: stalwart report {write_ledger}"
            )
            say(terminal_console(sys.stderr if json_out else None), said, markup=False)


def print_summary(s: dict[str, Any]) -> None:  # Any: the summary is a JSON document of any shape (json.dumps)
    from rich.table import Table  # deferred: heavy (rich)

    console = terminal_console()
    spares = "pool" if s["spare_nodes"] is None else s["spare_nodes"]
    say(
        console,
        f"[bold]{s['gpus']:,} GPUs ({s['nodes']:,} nodes), {s['days']:g} days, {s['trials']:,} trials"
        f"[/bold]  strategy={s['strategy']} spares={spares} elastic={s['elastic']}",
    )
    t = Table(title="outcome per trial")
    for col in ("metric", "mean", "p5", "p50", "p95"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    fmt = {
        "ettr": "{:.4f}",
        "interruptions": "{:,.1f}",
        "planned": "{:,.1f}",
        "lost_gpu_hours": "{:,.0f}",
        "cost": "{:,.0f}",
    }
    price = f"cost at {s['currency_per_gpu_hour']:g}/GPU-h"  # in the price's currency (--price)
    for key, f in fmt.items():
        row = s[key]
        t.add_row(price if key == "cost" else key, *(f.format(row[k]) for k in ("mean", "p5", "p50", "p95")))
    console.print(t)
    b = Table(title="where the wall-clock went (mean hours per trial)")
    b.add_column("bucket")
    b.add_column("hours", justify="right")
    total = sum(s["buckets_hours_mean"].values()) or 1.0
    b.add_column("share", justify="right")
    for k, v in s["buckets_hours_mean"].items():
        if v <= 0:
            continue
        b.add_row(k, f"{v:,.1f}", f"{100 * v / total:.1f}%")
    console.print(b)
