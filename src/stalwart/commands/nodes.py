"""``stalwart nodes``: every node's scheduler state, who drained it, and Stalwart's lifecycle state."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("nodes")
    def nodes_cmd(
        backend: str = typer.Option("local", "--backend", help="local (ledger only) or slurm (sinfo)."),
        state_dir: Path = typer.Option(
            None, "--state-dir", help="Node records directory (default stalwart-runs/health)."
        ),
        prefix: str = typer.Option("stalwart:", "--prefix", help="Drain-reason prefix of Stalwart's drains."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """List nodes with their states and reasons."""
        from ..health.backends import make_backend
        from ..health.node_store import DEFAULT_STATE_DIR, HealthStore

        store = HealthStore(state_dir or DEFAULT_STATE_DIR)
        records = store.records()
        sched = {s.node: s for s in make_backend(backend).list_nodes()}
        rows = []
        for name in sorted(set(records) | set(sched)):
            rec, s = records.get(name), sched.get(name)
            owner = "-"
            if s is not None and s.reason:
                owner = "stalwart" if s.reason.startswith(prefix) else "operator"
            rows.append(
                {
                    "node": name,
                    "scheduler_state": s.state if s else "",
                    "scheduler_reason": s.reason if s else "",
                    "drained_by": owner,
                    "state": rec.state.value if rec else "healthy",
                    "since": rec.since if rec else None,
                    "reason": rec.reason if rec else "",
                    "needs_human": bool(rec and rec.needs_human),
                }
            )
        if json_out:
            print(json.dumps(rows, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"nodes ({backend})")
        for col in (
            "node",
            "scheduler",
            "drained by",
            "scheduler reason",
            "stalwart state",
            "since",
            "reason",
        ):
            t.add_column(col)
        for r in rows:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["since"])) if r["since"] else "-"
            state = r["state"] + (" (needs human)" if r["needs_human"] else "")
            t.add_row(
                r["node"],
                r["scheduler_state"] or "-",
                r["drained_by"],
                r["scheduler_reason"] or "-",
                state,
                since,
                r["reason"] or "-",
            )
        Console(width=None if sys.stdout.isatty() else 160).print(t)
        if not rows:
            print(
                "no nodes known (no health records yet)" if backend == "local" else "Slurm reports no nodes"
            )
