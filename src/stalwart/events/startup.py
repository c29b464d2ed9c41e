"""Event kinds of a node's start-up: where the time before the first step went, beyond the core
kinds in :mod:`stalwart.events` (``account/startup.py`` splits the report's start-up bucket with it)."""

from __future__ import annotations

from dataclasses import dataclass

from . import Event, event


@event
@dataclass(frozen=True, kw_only=True)
class StartupMarks(Event):
    """The agent's own marks of its start-up (wall clock, seconds since the epoch); the process start
    is its ``JobStarted.ts``, the rendezvous's end its first ``AttemptStarted``, the workers' start
    ``WorkersStarted``. ``ts`` is when the services were up."""

    imported: float  # the interpreter started and Stalwart's modules imported: the agent's work begins
    services: float  # the node's services up: memory tier, live diagnosis, fork server launched, store client
