"""The agent's ledger sink: every event of this node goes through it into the append-only ledger.

A full disk never stops the job: events wait in memory (bounded; step records go first, decisions and
verdicts stay) and are written once there is room again, and the console is told once each way."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..errors import LedgerFullError
from ..events import Event, StepCompleted
from ..node_name import printable_name

KEPT_IN_MEMORY = 200_000  # events kept while the ledger cannot take them


def printable_nodes(ev: Event) -> Event:
    """``ev`` with its node names (``node``, an incident's ``nodes``) made printable
    (:func:`printable_name`): a name another process wrote reaches the ledger without raw control
    characters. An event whose names are printable already is returned as it is."""
    changes: dict[str, Any] = {}  # Any: dataclasses.replace's keyword arguments, each its field's type
    if ev.node != (shown := printable_name(ev.node)):
        changes["node"] = shown
    nodes = getattr(ev, "nodes", None)
    if isinstance(nodes, tuple) and any(printable_name(str(n)) != n for n in nodes):
        changes["nodes"] = tuple(printable_name(str(n)) for n in nodes)
    return dataclasses.replace(ev, **changes) if changes else ev


class Appender(Protocol):
    def extend(self, evs: Iterable[Event]) -> None: ...

    def close(self) -> None: ...


class NodeLedger:
    """Implements :class:`stalwart.launch.ports.LedgerSink` over a ledger writer."""

    def __init__(
        self,
        writer: Appender,
        *,
        run_id: str,
        node: str,
        notify: Callable[[Event], None] | None = None,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.writer = writer
        self.run_id = run_id
        self.node = node
        self.attempt = 0  # the attempt the events belong to (the runner moves it)
        self._notify = notify or (lambda ev: None)
        self._note = note or (lambda text: None)
        self.unwritten: list[Event] = []  # events the ledger could not take yet (full disk)
        self.dropped = 0
        self._full = False

    # Any: unpacked as the keyword arguments of each event (run_id: str, node: str, attempt: int)
    def ctx(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "node": self.node, "attempt": self.attempt}

    def emit(self, ev: Event, *, show: bool = True) -> None:
        self.record((ev,))
        if show:
            self._notify(ev)

    def record(self, evs: Iterable[Event]) -> None:
        self.unwritten.extend(map(printable_nodes, evs))
        try:
            self.writer.extend(self.unwritten)
        except LedgerFullError as exc:
            if not self._full:
                self._note(f"ledger not written ({exc}); keeping events in memory and retrying")
            self._full = True
            if len(self.unwritten) > KEPT_IN_MEMORY:
                keep = [e for e in self.unwritten if not isinstance(e, StepCompleted)]
                self.dropped += len(self.unwritten) - len(keep)
                self.unwritten = keep[-KEPT_IN_MEMORY:]
            return
        self.unwritten = []
        if self._full:
            self._full = False
            self._note("ledger writable again; the events kept in memory are written")

    @property
    def missing(self) -> int:
        """Events that never reached the ledger (kept in memory, or dropped)."""
        return len(self.unwritten) + self.dropped

    def close(self) -> None:
        self.writer.close()
