"""What the agent needs to act on a straggler: the detector's precision so far, and the quarantine
(shared with silent data corruption's, ``sdc_quarantine.py``).

- :func:`straggler_precision` (collector): the straggler detector's measured precision over the
  history before this attempt: this run directory's ledger (earlier attempts, earlier runs in it)
  plus, optionally, another run directory or ledger file (``--straggler-history``). Read once per
  attempt, only when the action is not observe-only;
- :func:`quarantine_node` (actuator): records the node as quarantined in the node records
  (``--health-state-dir``), through the same lifecycle and backend as a failed health check, so
  ``stalwart nodes`` lists it and the health gate keeps it out until it is re-validated.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ...diagnose.precision import DetectorStats, detector_stats
from ...events import Event
from ...ledger import read_available
from ...ledger.store import ledger_files

log = logging.getLogger(__name__)


def history_events(
    run_dir: Path, extra: Path | None, run_id: str, attempt: int
) -> tuple[list[Event], list[str]]:
    """Events before this attempt (this run's attempts from ``attempt`` on are left out) and what
    could not be read (never fatal: an unreadable history only leaves the precision unmeasured)."""
    out: list[Event] = []
    notes: list[str] = []
    for where in (run_dir, extra):
        if where is None:
            continue
        try:
            read = read_available(ledger_files(where), require_some=False)
        except Exception as exc:  # noqa: BLE001 - a missing or foreign history is not a reason to stop
            notes.append(f"{where}: {exc}")
            continue
        notes.extend(f"{sk.path}: {sk.reason}" for sk in read.skipped if not sk.not_ready)
        out.extend(e for e in read.events if not (e.run_id == run_id and e.attempt >= attempt))
    return out, notes


def straggler_precision(
    run_dir: Path, extra: Path | None, run_id: str, attempt: int
) -> tuple[DetectorStats | None, list[str]]:
    """The straggler detector's precision over the history (None: it never fired there)."""
    events, notes = history_events(run_dir, extra, run_id, attempt)
    stats = next((s for s in detector_stats(events) if s.detector == "straggler" and s.firings), None)
    return stats, notes


def quarantine_node(
    node: str,
    reason: str,
    fault: str = "straggler",
    recoverable: bool = True,
    *,
    now: float,
    state_dir: Path,
    backend: str,
) -> str:
    """Quarantine ``node`` in the node records for ``fault`` (a straggler; silent data corruption,
    ``sdc``, not recoverable: no health check can clear it); returns the state it ended in.

    The lifecycle decides as for a failed check (blast-radius cap and owned Slurm drains included:
    past the cap the node is only suspect and a human is paged); no ``HealthChecked`` is written,
    since no health check ran."""
    from ...health.findings import CheckStatus  # deferred: heavy (yaml)
    from ...health.lifecycle import CheckOutcome  # deferred: heavy (yaml)
    from ...health.node_controller import record_outcome  # deferred: heavy (yaml)

    outcome = CheckOutcome(
        status=CheckStatus.FAIL, reason=f"{fault}: {reason}", fault_key=fault, recoverable=recoverable
    )
    return record_outcome(node, outcome, now=now, state_dir=state_dir, backend=backend)


def listens_on(port: int, proc: Path = Path("/proc")) -> bool | None:
    """Whether this process holds a listening TCP socket on ``port`` (Linux ``/proc``); None when it
    cannot tell. The agent that hosts the c10d rendezvous store must not leave the job: the store,
    and with it the rendezvous of every other node, would go with it."""
    inodes = set()
    try:
        for table in ("tcp", "tcp6"):
            path = proc / "net" / table
            if not path.exists():
                continue
            for line in path.read_text().splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rpartition(":")[2], 16) == port:
                    inodes.add(cols[9])
        if not inodes:
            return False
        fds = proc / "self" / "fd"
        for fd in fds.iterdir():
            try:
                target = (fds / fd.name).readlink()
            except OSError:
                continue  # closed meanwhile
            if str(target).startswith("socket:[") and str(target)[8:-1] in inodes:
                return True
        return False
    except (OSError, ValueError):
        return None
