"""The agent's ports: what the job runner (launch/runner.py) and the supervisor of an attempt
(launch/attempt/supervisor.py) need from the world, as small typed protocols.

The real implementations are the agent's (launch/rendezvous/node_rendezvous.py, launch/attempt/node_workers.py,
launch/failure_files.py, launch/ledger_sink.py, launch/agent_chaos.py); the fakes in
launch/fakes.py serve the unit tests and the simulator (sim/agent_probe.py) alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..events import Event
from ..policy.job import TookOver
from ..policy.world_size import WorldPlan
from ..protocol import Message
from ..protocol.error_record import ErrorRecord
from .decision import AttemptOutcome
from .processes.worker_group import WorkerSpec
from .progress import ProgressTracker

# --- the ledger and the console -----------------------------------------------------------------------


class LedgerSink(Protocol):
    """The job's ledger: every event of this node, stamped with the job's context."""

    # Any: unpacked as the keyword arguments of each event (run_id: str, node: str, attempt: int)
    def ctx(self) -> dict[str, Any]:
        """run_id, node and attempt: the fields every event of this node carries."""
        ...

    def emit(self, ev: Event, *, show: bool = True) -> None:
        """Append one event; ``show``: also tell the console and the exporters."""
        ...

    def record(self, evs: Iterable[Event]) -> None:
        """Append events (step records) without showing them."""
        ...


class Progress(Protocol):
    """Steps done so far, of ``total`` (0: unknown), the attempt and the rate; ``now``: when (the
    newest step's end), else the call's time."""

    def __call__(
        self, step: int, total: int, attempt: int, rate: float, *, now: float | None = None
    ) -> None: ...


class Stepped(Protocol):
    """Steps of ``attempt`` completed, as (rank, start, end), of this node's ``ranks`` ranks."""

    def __call__(self, attempt: int, steps: Sequence[tuple[int, float, float]], ranks: int) -> None: ...


class Console(Protocol):
    def note(self, text: str) -> None: ...

    def progress(
        self, step: int, total: int, attempt: int, rate: float, *, now: float | None = None
    ) -> None: ...

    def stepped(self, attempt: int, steps: Sequence[tuple[int, float, float]], ranks: int) -> None:
        """Steps of ``attempt`` completed, as (rank, start, end), of this node's ``ranks`` ranks: the
        console tells the start-up at the job's first step, and a restart's recovery once every rank
        stepped again (where the report's recovery table ends it)."""
        ...


# --- what the supervisor of one attempt asks ------------------------------------------------------


class FailureFiles(Protocol):
    """This attempt's run files about failed ranks: error records and stack dumps."""

    def error_of(self, rank: int, log: Path | None) -> ErrorRecord | None:
        """Root cause of a failed rank (its error record, or the last traceback in its log)."""
        ...

    def raised_since(self) -> dict[int, float]:
        """Rank -> when it wrote this attempt's error record."""
        ...

    def raised_not_exited(self) -> dict[int, int]:
        """Ranks that recorded an exception (-> exit code), after a bounded wait for their exits."""
        ...

    def capture_stacks(self) -> dict[int, str]:
        """Every worker's Python stacks, dumped on request."""
        ...

    def injected_by(self, pid: int) -> str:
        """The chaos plan entry that made process ``pid`` fail on purpose ("" when none did)."""
        ...


class JobLink(Protocol):
    """The job around one attempt: the agent's signal, the rendezvous, the node's state."""

    def signal(self) -> int | None:
        """The signal the agent received, if any."""
        ...

    def nodes_waiting(self) -> int | None:
        """Nodes waiting to join the round; None when there is no rendezvous to ask."""
        ...

    def release_spares(self) -> None:
        """Tell hot spares the job is done."""
        ...

    def quarantine(
        self, node: str, reason: str, *, fault: str = "straggler", recoverable: bool = True
    ) -> str:
        """Quarantine ``node`` for ``fault`` (its key in the node records); the node state it ended
        in. ``recoverable=False``: passing checks never re-admit it, an operator must."""
        ...

    def hosted_stores(self) -> str:
        """The stores this node's agent serves that the other nodes need (the c10d rendezvous store),
        in words; "" when none. The round's store, which the group's first node serves, the policies
        add from the world plan (:func:`stalwart.policy.world_size.needed_by_others`): a node serving
        either never leaves the job, neither for silent data corruption nor as a straggler."""
        ...


class AttemptChaos(Protocol):
    def tick(self, tracker: ProgressTracker) -> None:
        """Agent-side faults due at the workers' progress (once per supervisor tick)."""
        ...


# --- what the job runner asks ---------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One rendezvous round: this node's group rank, the nodes by group rank, the workers' store."""

    group_rank: int
    names: tuple[str, ...]
    addr: str
    port: int


class Rendezvous(Protocol):
    def meet(self) -> Round:
        """Form the next round (raises when it cannot)."""
        ...

    def nodes_waiting(self) -> int | None:
        """Nodes waiting to join; None when there is no rendezvous (one node, static ranks)."""
        ...

    def job_done(self) -> bool:
        """Whether the active nodes announced the job's end (a hot spare asks; raises when the round's
        store went away)."""
        ...

    def announce_done(self) -> None:
        """Tell the hot spares of this round that the job is done."""
        ...

    def close(self, *, leaving: bool) -> None:
        """The job is over for this node; ``leaving``: the others go on, keep the rendezvous open."""
        ...


class WorkerLauncher(Protocol):
    def run(self, attempt: int, plan: WorldPlan, met: Round) -> AttemptOutcome:
        """Start this node's workers for ``attempt`` on ``plan`` and supervise them to an outcome."""
        ...

    def rejoin(self) -> tuple[TookOver, Round] | None:
        """Before the first rendezvous: this node's place in a running group that shrank in place and
        took it back in (its workers then join that group's next generation), else None. Bounded."""
        ...

    def take_over(self, plan: WorldPlan, met: Round) -> TookOver | None:
        """A hot spare of ``plan``: the plan with this node in a lost node's place once it claimed that
        place (its workers then join the other nodes' in-place re-formation), else None. Never waits."""
        ...


class RunFiles(Protocol):
    def newest_good(self) -> int | None:
        """The newest checkpoint step in the run directory that verifies, or None."""
        ...

    def finished_elsewhere(self) -> str:
        """What the run directory's ledger says when another node ended the job succeeded since this
        agent started ("" when none did, or it cannot be read)."""
        ...


class HealthGate(Protocol):
    def check(self, attempt: int) -> tuple[str, str]:
        """("", "") when this node may start, else (the reason it may not, its node state)."""
        ...


class RunningProcess(Protocol):
    @property
    def pid(self) -> int: ...


class WorkerProcesses(Protocol):
    """This attempt's worker processes as the supervisor and in-place recovery drive them
    (launch/processes/worker_group.py ``WorkerGroup``)."""

    exit_times: dict[int, float]

    @property
    def procs(self) -> Mapping[int, RunningProcess]: ...

    def poll(self) -> dict[int, int | None]: ...

    def pid(self, rank: int) -> int: ...

    def signal(self, sig: int, ranks: Sequence[int] | None = None) -> None: ...

    def stop(self, grace_s: float) -> dict[int, int]: ...

    def replace(self, spec: WorkerSpec, reap_s: float) -> int: ...


class Inbox(Protocol):
    """The workers' messages to the agent (protocol/pipe.py ``Receiver``)."""

    def new_channel(self) -> int: ...

    def drain(self) -> list[Message]: ...


class ControlWrites(Protocol):
    """The agent's side of the shared control block (protocol/control.py ``ControlBlock``)."""

    def request_stop(self, after_steps: int) -> None: ...

    def request_reform(self, generation: int, place: tuple[int, int] | None = None) -> None: ...

    def refuse_reform(self) -> None: ...

    def read_beat(self, slot: int) -> tuple[float, int, str] | None: ...
