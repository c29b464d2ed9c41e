"""``stalwart report``: where a run's wall time went."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        run_dir: Path = typer.Argument(..., help="Run directory (or a .ledger file) of 'stalwart run'."),
        as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Goodput, badput buckets, interruptions, MTBF and MTTR of a run, from its ledger."""
        from ..account.report import print_report

        print_report(run_dir, as_json=as_json)
