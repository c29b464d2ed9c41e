"""Fakes of the agent's ports (launch/ports.py) and of what a supervisor watches: recording, scripted,
with no process, socket, file or sleep. One set serves the unit tests and the simulator
(sim/agent_probe.py), so both drive the shipped supervisor, runner and job policy the same way."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..events import Event
from ..policy.job import TookOver
from ..policy.world_size import WorldPlan
from ..protocol import Message
from ..protocol.error_record import ErrorRecord
from .decision import AttemptOutcome
from .ports import Round
from .processes.worker_group import WorkerSpec
from .progress import ProgressTracker

# --- the ledger, the console --------------------------------------------------------------------------


@dataclass
class RecordingLedger:
    """A ledger sink that keeps every event in order."""

    run_id: str = "sim"
    node: str = "n0"
    attempt: int = 0
    events: list[Event] = field(default_factory=list)
    shown: list[Event] = field(default_factory=list)

    # Any: unpacked as the keyword arguments of each event (run_id: str, node: str, attempt: int)
    def ctx(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "node": self.node, "attempt": self.attempt}

    def emit(self, ev: Event, *, show: bool = True) -> None:
        self.events.append(ev)
        if show:
            self.shown.append(ev)

    def record(self, evs: Iterable[Event]) -> None:
        self.events.extend(evs)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


@dataclass
class RecordingConsole:
    notes: list[str] = field(default_factory=list)
    steps: list[tuple[int, int, int, float]] = field(default_factory=list)
    stepped_: list[tuple[int, int, int]] = field(default_factory=list)  # (attempt, steps, ranks)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def stepped(self, attempt: int, steps: Sequence[tuple[int, float, float]], ranks: int) -> None:
        self.stepped_.append((attempt, len(steps), ranks))

    def progress(self, step: int, total: int, attempt: int, rate: float, *, now: float | None = None) -> None:
        self.steps.append((step, total, attempt, rate))


# --- what a supervisor watches and asks ---------------------------------------------------------------


@dataclass
class FakeGroup:
    """A worker group whose exit codes the test sets; ``stop`` ends every rank still running (SIGTERM)."""

    codes: dict[int, int | None]
    exit_times: dict[int, float] = field(default_factory=dict)
    stops: list[float] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, ranks: Iterable[int]) -> FakeGroup:
        return cls({r: None for r in ranks})

    replaced: list[int] = field(default_factory=list)

    @property
    def procs(self) -> dict[int, FakeProc]:
        return {r: FakeProc(self.pid(r)) for r in self.codes}

    def poll(self) -> dict[int, int | None]:
        return dict(self.codes)

    def pid(self, rank: int) -> int:
        return 10_000 + rank

    def signal(self, sig: int, ranks: Sequence[int] | None = None) -> None:
        self.signals.append(sig)

    def stop(self, grace_s: float) -> dict[int, int]:
        self.stops.append(grace_s)
        stopped = {r: (-signal.SIGTERM if c is None else c) for r, c in self.codes.items()}
        self.codes = dict(stopped)
        return stopped

    def replace(self, spec: WorkerSpec, reap_s: float) -> int:
        self.replaced.append(spec.global_rank)
        self.codes[spec.global_rank] = None
        return self.pid(spec.global_rank)


@dataclass(frozen=True)
class FakeProc:
    pid: int


@dataclass
class FakePipe:
    """The workers' message pipe: the test appends, the supervisor drains."""

    queue: list[Message] = field(default_factory=list)
    channels: int = 0

    def new_channel(self) -> int:
        self.channels += 1
        return 100 + self.channels

    def drain(self) -> list[Message]:
        out, self.queue = self.queue, []
        return out


@dataclass
class FakeBlock:
    """The control block: no heartbeats; stop requests recorded (or refused, ``refuse_stop``)."""

    stop_after: list[int] = field(default_factory=list)
    refuse_stop: str = ""

    reforms: list[int] = field(default_factory=list)  # generations asked for; -1: refused

    def read_beat(self, slot: int) -> tuple[float, int, str] | None:
        return None

    def request_stop(self, after_steps: int) -> None:
        if self.refuse_stop:
            raise RuntimeError(self.refuse_stop)
        self.stop_after.append(after_steps)

    def request_reform(self, generation: int, place: tuple[int, int] | None = None) -> None:
        self.reforms.append(generation)

    def refuse_reform(self) -> None:
        self.reforms.append(-1)


def specs(ranks: Iterable[int]) -> list[WorkerSpec]:
    """One spec a rank (local and global rank alike), no environment, output inherited."""
    return [WorkerSpec(local_rank=r, global_rank=r, env={}, log_path=None) for r in ranks]


@dataclass
class FakeFailureFiles:
    """Error records by rank, ranks that raised (and when), stacks to capture."""

    errors: dict[int, ErrorRecord] = field(default_factory=dict)
    raised: dict[int, int] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)
    injected: dict[int, str] = field(default_factory=dict)  # pid -> the chaos plan entry that failed it

    def error_of(self, rank: int, log: Path | None) -> ErrorRecord | None:
        return self.errors.get(rank)

    def raised_since(self) -> dict[int, float]:
        return dict(self.since)

    def raised_not_exited(self) -> dict[int, int]:
        return dict(self.raised)

    def capture_stacks(self) -> dict[int, str]:
        return dict(self.stacks)

    def injected_by(self, pid: int) -> str:
        return self.injected.get(pid, "")


@dataclass
class FakeJobLink:
    """The job around an attempt: a signal and nodes waiting, each given by a function of nothing."""

    signal_of: Callable[[], int | None] = lambda: None
    waiting_of: Callable[[], int | None] | None = None  # None: no rendezvous
    released: int = 0
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    faults: list[tuple[str, bool]] = field(default_factory=list)  # each quarantine's fault, recoverable
    node_state: str = "quarantined"
    stores: str = ""  # what hosted_stores answers

    def signal(self) -> int | None:
        return self.signal_of()

    def hosted_stores(self) -> str:
        return self.stores

    def nodes_waiting(self) -> int | None:
        return self.waiting_of() if self.waiting_of is not None else None

    def release_spares(self) -> None:
        self.released += 1

    def quarantine(
        self, node: str, reason: str, *, fault: str = "straggler", recoverable: bool = True
    ) -> str:
        self.quarantined.append((node, reason))
        self.faults.append((fault, recoverable))
        return self.node_state


@dataclass
class ScriptedChaos:
    """Called once per supervisor tick: ``script(tick)`` plays the workers' side of the tick."""

    script: Callable[[int], None] = lambda tick: None
    ticks: int = 0
    max_ticks: int = 0  # >0: refuse to go on after so many ticks (a loop that never decides)

    def tick(self, tracker: ProgressTracker) -> None:
        if self.max_ticks and self.ticks >= self.max_ticks:
            raise RuntimeError(f"no decision after {self.max_ticks} supervisor ticks")
        tick, self.ticks = self.ticks, self.ticks + 1
        self.script(tick)


# --- what the job runner asks -------------------------------------------------------------------------


@dataclass
class FakeRendezvous:
    """Rounds given in advance: each a tuple of node names by group rank, or an exception to raise. A
    hot spare's wait ends when ``done`` or ``waiting`` say so (functions of the wait's poll count)."""

    rounds: list[Sequence[str] | BaseException]
    done_at: int | None = None  # the poll at which the active nodes announce the end
    waiting_at: int | None = None  # the poll from which a node waits to join
    lost_at: int | None = None  # the poll at which the round's store goes away
    max_polls: int = 10_000  # a wait that never ends fails (as a lost store) instead of spinning
    polls: int = 0
    met: list[tuple[str, ...]] = field(default_factory=list)
    announced: int = 0
    closed: list[bool] = field(default_factory=list)

    def meet(self) -> Round:
        if not self.rounds:
            raise RuntimeError("no more rounds in this test")
        r = self.rounds.pop(0)
        if isinstance(r, BaseException):
            raise r
        names = tuple(r)
        self.met.append(names)
        return Round(0, names, "127.0.0.1", 29500)

    def nodes_waiting(self) -> int | None:
        return 1 if self.waiting_at is not None and self.polls >= self.waiting_at else 0

    def job_done(self) -> bool:
        self.polls += 1
        if self.polls > self.max_polls:
            raise RuntimeError(f"a hot spare polled {self.max_polls} times: nothing ended its wait")
        if self.lost_at is not None and self.polls >= self.lost_at:
            raise ConnectionError("the round's store went away")
        return self.done_at is not None and self.polls >= self.done_at

    def announce_done(self) -> None:
        self.announced += 1

    def close(self, *, leaving: bool) -> None:
        self.closed.append(leaving)


@dataclass
class ScriptedWorkers:
    """A worker launcher whose attempts end as ``outcome(attempt, plan)`` says (or as the next of a
    list); every start is recorded as (attempt, active nodes)."""

    outcomes: list[AttemptOutcome] = field(default_factory=list)
    outcome: Callable[[int, WorldPlan], AttemptOutcome] | None = None
    started: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    takes_over: Callable[[WorldPlan], TookOver | None] = lambda plan: None  # a spare's take-over
    returns: tuple[TookOver, Round] | None = None  # a place in a running group, taken before the rendezvous

    def rejoin(self) -> tuple[TookOver, Round] | None:
        return self.returns

    def take_over(self, plan: WorldPlan, met: Round) -> TookOver | None:
        return self.takes_over(plan)

    def run(self, attempt: int, plan: WorldPlan, met: Round) -> AttemptOutcome:
        self.started.append((attempt, plan.active))
        if self.outcome is not None:
            return self.outcome(attempt, plan)
        if not self.outcomes:
            raise RuntimeError("no more attempt outcomes in this test")
        return self.outcomes.pop(0)


@dataclass
class FakeRunFiles:
    newest: int | None = None
    asked: int = 0
    finished: str = ""  # what finished_elsewhere says

    def newest_good(self) -> int | None:
        self.asked += 1
        return self.newest

    def finished_elsewhere(self) -> str:
        return self.finished


@dataclass
class FakeGate:
    """The health gate's answer per attempt: (reason, node state); absent: the node may start."""

    refusals: dict[int, tuple[str, str]] = field(default_factory=dict)

    def check(self, attempt: int) -> tuple[str, str]:
        return self.refusals.get(attempt, ("", ""))


@dataclass
class SignalLatch:
    """A signal that arrives at a given count of asks (the runner and the supervisor ask often)."""

    signum: int | None = None
    at: int = 0
    asks: int = 0

    def __call__(self) -> int | None:
        self.asks += 1
        return self.signum if self.signum is not None and self.asks > self.at else None


# --- the in-place board -------------------------------------------------------------------------------


@dataclass
class RecordingBoard:
    """A :class:`~stalwart.launch.inplace.board.Board` that records what this node wrote (``sent``, in
    order) and answers what the test says the other nodes wrote."""

    # Any: an Announcement (launch/inplace/board.py, a layer above this one)
    seen: Any = None  # the newest announcement
    refused: tuple[str, str] | None = None
    quiet: dict[str, float] = field(default_factory=dict)  # seconds each watched node has been silent
    gone: dict[str, float] = field(default_factory=dict)  # watched nodes whose agent process is gone
    departed: frozenset[str] = frozenset()  # of ``gone``: those that left the job on purpose
    closed: list[bool] = field(default_factory=list)  # each close: whether this node left the job
    offered: tuple[str, ...] = ()
    seqs: dict[str, int] = field(default_factory=dict)  # how many times each node offered (default 1)
    readied: dict[str, int] = field(default_factory=dict)
    sent: list = field(default_factory=list)

    # Any: an Announcement (launch/inplace/board.py, a layer above this one)
    def announce(self, a: Any) -> None:
        self.sent.append(a)

    # Any: an Announcement (launch/inplace/board.py, a layer above this one)
    def latest(self) -> Any:
        return self.seen

    def close(self, leaving: bool = False) -> None:
        self.closed.append(leaving)

    def waiting(self, generation: int) -> None:
        self.sent.append(("waiting", generation))

    def refuse(self, reason: str) -> None:
        self.sent.append(("refuse", reason))

    def refusal(self) -> tuple[str, str] | None:
        return self.refused

    def silence(self) -> dict[str, float]:
        return self.quiet

    def dead(self) -> dict[str, float]:
        return self.gone

    def left(self) -> frozenset[str]:
        return self.departed

    # Any: an Announcement (launch/inplace/board.py, a layer above this one)
    def publish_group(self, a: Any) -> None:
        self.sent.append(("group", a))

    def offers(self) -> tuple[str, ...]:
        return self.offered

    def offer_seq(self, node: str) -> int:
        return self.seqs.get(node, 1)

    def watch_more(self, nodes: Sequence[str]) -> None:
        self.sent.append(("watch", tuple(nodes)))

    # Any: an Announcement (launch/inplace/board.py, a layer above this one)
    def invite(self, a: Any) -> None:
        self.sent.append(("invite", a))

    def ready(self, generation: int) -> None:
        self.sent.append(("ready", generation))

    def ready_nodes(self) -> dict[str, int]:
        return dict(self.readied)
