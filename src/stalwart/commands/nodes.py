"""``stalwart nodes``: every node's scheduler state, who drained it, and Stalwart's lifecycle state."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from ..errors import SchedulerError
from ..terminal import console, say


def register(app: typer.Typer) -> None:
    @app.command("nodes")
    def nodes_cmd(
        backend: str = typer.Option("local", "--backend", help="local (ledger only) or slurm (sinfo)."),
        state_dir: Path = typer.Option(
            None,
            "--state-dir",
            help="Node records directory (default: "
            "stalwart-runs/health and every stalwart-runs/<run>/health).",
        ),
        prefix: str = typer.Option("stalwart:", "--prefix", help="Drain-reason prefix of Stalwart's drains."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """List nodes with their states and reasons."""
        from ..health.backends import make_backend  # deferred: heavy (pydantic)
        from ..health.lifecycle import UNCHECKED  # deferred: as the store
        from ..health.node_store import DEFAULT_STATE_DIR, HealthStore  # deferred: heavy (pydantic)

        records = _records(state_dir, DEFAULT_STATE_DIR, HealthStore)
        try:
            listed = make_backend(backend).list_nodes()
        except SchedulerError as exc:
            first = exc.message.splitlines()[0] if exc.message else "no answer"
            hint = f"{exc.hint}; " if exc.hint else ""  # the backend's hint fits what Slurm said
            raise SchedulerError(
                f"cannot list Slurm nodes: {first}",
                f"{hint}'stalwart nodes' without --backend lists Stalwart's own records",
            ) from None
        sched = {s.node: s for s in listed}
        rows: list[dict[str, Any]] = []  # Any: JSON rows (json.dumps), each column of its own type
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
                    "state": rec.state.value if rec else UNCHECKED,  # listed by the scheduler only
                    "since": rec.since if rec else None,
                    "reason": rec.reason if rec else "",
                    "needs_human": bool(rec and rec.needs_human),
                }
            )
        if json_out:
            print(json.dumps(rows, indent=1))
            return
        from rich.table import Table  # deferred: heavy (rich)

        t = Table(title=f"nodes ({backend})")
        # short columns stay whole (no "quarantin/ed"); the reasons, long, follow the table as lines
        for col in ("node", "scheduler", "drained by", "stalwart state", "since"):
            t.add_column(col, overflow="fold", no_wrap=col != "node")
        reasons = []
        for r in rows:
            since = time.strftime("%m-%d %H:%M", time.localtime(r["since"])) if r["since"] else "-"
            shown = "never checked" if r["state"] == UNCHECKED else r["state"]
            state = shown + (" (needs human)" if r["needs_human"] else "")
            t.add_row(r["node"], r["scheduler_state"] or "-", r["drained_by"], state, since)
            if r["reason"]:
                reasons.append(f"{r['node']}: {r['reason']}")
            if r["scheduler_reason"]:
                reasons.append(f"{r['node']} (scheduler): {r['scheduler_reason']}")
        if rows:
            con = console()
            con.print(t)
            for line in reasons:
                say(con, line, markup=False)
        else:
            print(
                "no nodes known: no health records yet (a run with the health gate writes them; "
                "see --state-dir)"
                if backend == "local"
                else "Slurm reports no nodes"
            )


def _records(state_dir, default_dir: Path, store_cls) -> dict:
    """Node records from one directory, or by default from the shared one and every run's own
    (``stalwart run`` keeps them in ``<run dir>/health``); the newest record of a node wins."""
    dirs = [Path(state_dir)] if state_dir else [default_dir, *sorted(default_dir.parent.glob("*/health"))]
    merged: dict = {}
    for d in dict.fromkeys(dirs):
        if not d.is_dir():
            continue
        for name, rec in store_cls(d).records().items():
            if name not in merged or rec.since > merged[name].since:
                merged[name] = rec
    return merged
