"""The exception types a user can cause.

Every error that bad input can trigger (a config, a flag, a file, telemetry) is one of these.
The message says what is wrong; ``hint`` says what to do. The CLI prints both on one line,
without a traceback, and exits with ``exit_code``.
"""

from __future__ import annotations


class StalwartError(Exception):
    """Base class: an error the user can act on."""

    exit_code = 2

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(StalwartError):
    """A configuration value, file or flag is invalid."""


class LedgerError(StalwartError):
    """A ledger file is missing, unreadable, foreign or corrupt."""


class LedgerNotReadyError(LedgerError):
    """A ledger file exists but its writer has not finished creating it yet (retry shortly)."""


class LedgerFullError(LedgerError):
    """The ledger could not be written because the disk (or quota) is full.

    Exit 75: an infrastructure fault, not bad input; the agent turns it into a verdict.
    """

    exit_code = 75


class CheckpointError(StalwartError):
    """A checkpoint cannot be written or no checkpoint can be trusted."""


class SilentCorruptionError(StalwartError):
    """Data-parallel replicas hold different state and there is no clean checkpoint to roll back to,
    or the corruption came back after rollbacks (a faulty node): the run must not go on."""


class FaultPlanError(StalwartError):
    """A chaos fault plan is malformed."""


class TelemetryError(StalwartError):
    """Telemetry could not be read or parsed."""


class SchedulerError(StalwartError):
    """The scheduler (Slurm, Kubernetes) refused or failed a command."""
