"""The event vocabulary: everything that happens to a run, as frozen dataclasses.

Every event has a wall-clock timestamp ``ts`` (seconds since the epoch) and optional context
(run, node, attempt, rank). Events are serialised as ``kind`` + JSON payload by the ledger.

The whole vocabulary lives in this package, on the layer below everything that writes or reads
events: the core kinds here, the health, checkpoint and integrity kinds in :mod:`.node_health`,
:mod:`.checkpoint` and :mod:`.integrity`, imported at the end of this module, so every kind is registered before the
first ``decode``. The ledger decodes every registered kind and returns :class:`RawEvent` for kinds
it does not know, so an old reader never fails on a new file.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

_REGISTRY: dict[str, type[Event]] = {}


def event(cls: type[Event]) -> type[Event]:
    """Register an event class under its ``kind`` (the class name by default)."""
    kind = cls.__dict__.get("kind") or cls.__name__
    if kind in _REGISTRY and _REGISTRY[kind] is not cls:
        raise ValueError(f"event kind {kind!r} registered twice")
    cls.kind = kind
    _REGISTRY[kind] = cls
    return cls


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of all events."""

    kind: ClassVar[str] = "Event"
    ts: float
    run_id: str = ""
    node: str = ""
    attempt: int = -1
    rank: int = -1

    def to_payload(self) -> dict[str, Any]:  # Any: JSON values of any shape (json.dumps/json.loads)
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class RawEvent(Event):
    """An event of a kind this reader does not know; its payload is kept verbatim."""

    raw_kind: str
    # Any: a raw event's payload is whatever JSON an unknown kind carried (json.loads)
    payload: dict[str, Any] = field(default_factory=dict)


# --- job and attempts -----------------------------------------------------------------------


@event
@dataclass(frozen=True, kw_only=True)
class JobStarted(Event):
    script: str
    args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    max_restarts: int = 0
    # Any: run configuration as JSON of any shape (json.dumps)
    config: dict[str, Any] = field(default_factory=dict)


@event
@dataclass(frozen=True, kw_only=True)
class JobEnded(Event):
    verdict: str  # one line: cause and evidence
    outcome: str  # succeeded | user_error | infra_exhausted | preempted | aborted | rendezvous_failed
    exit_code: int
    requeue_helps: bool


@event
@dataclass(frozen=True, kw_only=True)
class AttemptStarted(Event):
    world_size: int
    group_rank: int = 0
    num_nodes: int = 1
    master: str = ""


@event
@dataclass(frozen=True, kw_only=True)
class AttemptEnded(Event):
    reason: str


@event
@dataclass(frozen=True, kw_only=True)
class WorkersStarted(Event):
    pids: tuple[int, ...]
    global_ranks: tuple[int, ...]


# --- training progress ----------------------------------------------------------------------


@event
@dataclass(frozen=True, kw_only=True)
class StepCompleted(Event):
    step: int
    start: float
    duration: float
    sections: dict[str, float] = field(default_factory=dict)


@event
@dataclass(frozen=True, kw_only=True)
class TrainingResumed(Event):
    step: int  # the first step this attempt will run
    from_checkpoint: str = ""  # a checkpoint's path; "live:rank<R>": a replica's live state, in place;
    # "live:rank<R>" + LEFT_IN_MEMORY: the state rank R left in its node's memory on the way out


LEFT_IN_MEMORY = (
    ":node-memory"  # the suffix of a resume from a state left on the way out (train/left_state.py)
)


@event
@dataclass(frozen=True, kw_only=True)
class TrainingFinished(Event):
    step: int


@event
@dataclass(frozen=True, kw_only=True)
class ReformedInPlace(Event):
    """An in-place recovery completed: the failed ranks were replaced, every rank joined process-group
    ``generation`` and holds the live state after ``step`` steps (``lost_steps`` beyond the
    interrupted one were redone). ``phases``: seconds, fault -> first step (docs/fast-recovery.md).
    When the group shrank in place (a lost node, no hot spare), ``ranks`` is empty and ``world_size``
    is the new world size, ``shrunk_from`` the old one; when it grew back in place (a node returned and
    took a free place), ``ranks`` are the newcomer's ranks, ``world_size`` the new size and
    ``grown_from`` the old one."""

    generation: int
    ranks: tuple[int, ...]  # the replaced ranks
    step: int
    lost_steps: int
    bytes_moved: int
    state_bytes: int
    phases: dict[str, float]
    # a lost node without a hot spare: the survivors re-formed at a smaller world size (0: unchanged)
    world_size: int = 0
    shrunk_from: int = 0
    grown_from: int = 0  # a node returned: the group grew in place from this world size


# --- checkpoints ----------------------------------------------------------------------------


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointStaged(Event):
    step: int
    stall_s: float
    bytes: int = 0


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointCommitted(Event):
    step: int
    path: str
    stall_s: float  # time the training loop was blocked
    persist_s: float = 0.0  # background time to durable storage
    bytes: int = 0
    tier: str = "disk"
    emergency: bool = False


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointLoaded(Event):
    step: int
    path: str
    duration_s: float
    tier: str = "disk"


@event
@dataclass(frozen=True, kw_only=True)
class CheckpointRejected(Event):
    """A checkpoint was skipped on load (torn, corrupt, incomplete): the fallback's reason."""

    path: str
    reason: str
    step: int = -1


# --- failures and decisions -----------------------------------------------------------------


@event
@dataclass(frozen=True, kw_only=True)
class FailureDetected(Event):
    failure: str  # crash | hang | agent_lost | peer_lost | preempted | user_error
    evidence: str
    onset: float  # best estimate of when the fault happened
    step: int = -1
    exit_code: int | None = None
    signal: str = ""
    error_type: str = ""
    error_message: str = ""
    injected: str = ""  # the chaos plan's entry that caused it (``hang@rank=1,step=5``), "" for a real one


@event
@dataclass(frozen=True, kw_only=True)
class StackCaptured(Event):
    stack: str
    reason: str = ""


@event
@dataclass(frozen=True, kw_only=True)
class DecisionTaken(Event):
    action: str  # restart | stop | continue | exclude_node | drain | ...
    reason: str
    restarts_used: int = 0
    restarts_allowed: int = 0
    backoff_s: float = 0.0


@event
@dataclass(frozen=True, kw_only=True)
class WorkersStopped(Event):
    reason: str


@event
@dataclass(frozen=True, kw_only=True)
class ChaosInjected(Event):
    fault: str
    step: int = -1
    detail: str = ""
    until_step: int = -1  # a fault that holds for a span of steps (slow): its last step; -1 none/open


@event
@dataclass(frozen=True, kw_only=True)
class ChaosUnfired(Event):
    """Planned faults that never fired in the run (their step lay past its last step, their rank
    never ran), written by the agent before its verdict: no fault is dropped silently."""

    faults: tuple[str, ...]  # each as a --chaos spec
    line: str  # what the console printed


@event
@dataclass(frozen=True, kw_only=True)
class StragglerDetected(Event):
    """A rank spends markedly longer on its own work than the fleet (rank = the straggler)."""

    score: float
    step: int
    evidence: str


@event
@dataclass(frozen=True, kw_only=True)
class StragglerCleared(Event):
    score: float
    step: int


@event
@dataclass(frozen=True, kw_only=True)
class TimeoutsCalibrated(Event):
    hang_timeout_s: float
    p99_step_s: float
    samples: int
    reason: str


# --- diagnosis (stalwart.diagnose) ---------------------------------------------------------------


@event
@dataclass(frozen=True, kw_only=True)
class IncidentRaised(Event):
    """A diagnosis: the real cause behind one or more symptoms (see stalwart.diagnose.incident)."""

    cause: str
    fault_class: str  # user_program | system_software | hardware | facility | unknown
    component: str  # gpu | gpu_memory | nvlink | nic | ib_link | mount | cooling | power | switch | ...
    confidence: float
    action: str
    action_taken: bool = False
    rule: str = ""
    onset: float = 0.0
    evidence: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    domain: str = ""
    cost_gpu_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)


def _jsonable(value: Any) -> Any:  # Any: JSON values of any shape (json.dumps/json.loads)
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def encode(ev: Event) -> tuple[str, str]:
    """Return ``(kind, json payload)`` for storage."""
    if isinstance(ev, RawEvent):
        return ev.raw_kind, json.dumps(ev.payload, separators=(",", ":"))
    return ev.kind, json.dumps(_jsonable(ev.to_payload()), separators=(",", ":"))


# Any: JSON values of any shape (json.dumps/json.loads)
def decode(kind: str, payload: str | dict[str, Any]) -> Event:
    """Rebuild an event; unknown kinds and fields come back as :class:`RawEvent`."""
    data = json.loads(payload) if isinstance(payload, str) else dict(payload)
    cls = _REGISTRY.get(kind)
    if cls is not None:
        names = {f.name: f for f in dataclasses.fields(cls)}
        if set(data) <= set(names):
            kwargs = {}
            for key, value in data.items():
                if isinstance(value, list) and "tuple" in str(names[key].type):
                    value = tuple(value)
                kwargs[key] = value
            try:
                return cls(**kwargs)
            except TypeError:
                pass
    base = {k: data[k] for k in ("ts", "run_id", "node", "attempt", "rank") if k in data}
    base.setdefault("ts", 0.0)
    return RawEvent(raw_kind=kind, payload=data, **base)


def registered_kinds() -> dict[str, type[Event]]:
    return dict(_REGISTRY)


# The kinds of the health and checkpoint packages; imported last, as they build on ``event`` above.
from . import checkpoint, integrity, node_health, startup  # noqa: E402, F401
