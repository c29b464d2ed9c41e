"""``stalwart report``: where a run's wall time went."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        run_dir: Path = typer.Argument(..., help="Run directory (or a .ledger file) of 'stalwart run'."),
        as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    ) -> None:
        """Goodput, badput buckets, interruptions, MTBF and MTTR of a run, from its ledger."""
        from ..account.report import print_report  # deferred: heavy (pydantic)

        hint = "give the run directory that 'stalwart run' printed as 'run dir:' (by default stalwart-runs/<run-id>)"
        if not run_dir.exists():
            raise ConfigError(f"{run_dir} does not exist", hint)
        if run_dir.is_file() and run_dir.suffix != ".ledger":
            raise ConfigError(f"{run_dir} is not a run directory or a .ledger file", hint)
        if (
            run_dir.is_dir()
            and not any(run_dir.glob("*.ledger"))
            and not any(run_dir.glob("ledger/*.ledger"))
        ):
            raise ConfigError(f"{run_dir} holds no ledger: it is not the directory of a run", hint)
        print_report(run_dir, as_json=as_json)
