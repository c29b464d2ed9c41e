"""The agent-worker contract: worker environment, pipe messages, and one default per timeout.

Both sides import this module and nothing else of each other:

* the **environment** the agent gives a worker. Stalwart's own variables use the prefix
  ``STALWART_W_``, distinct from ``STALWART_<SETTING>`` that configures ``stalwart run``, so a
  ``stalwart run`` started inside a worker never reads its parent's run dir or fault plan.
  ``WorkerEnv.to_env``/``WorkerEnv.from_env`` are the only writer and reader.
  ``elastic_env`` builds the variables torchrun gives its workers (``RANK`` ... ``TORCHELASTIC_*``).
* the **messages** a worker sends over its pipe: frozen records, one line each (``encode``/``decode``).
  A line is JSON keyed by ``k``, except the per-step record, a compact text line (``D ...``):
  JSON's float encoding costs ~40 us per record, the text line a few.
* the **signals** that cross the boundary: the stop request (``STOP_SIGNALS``, from the agent or a
  scheduler) and the request for every thread's stack (``STACK_DUMP_SIGNAL``);
* every **path** goes through :class:`stalwart.protocol.run_dir.RunDir` (and the agent's node memory
  directory through :class:`stalwart.protocol.run_dir.MemDir`).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

PREFIX = "STALWART_W_"

# The process-group timeout's one default, read by the agent's configuration and by the SDK alike
# (the hang timeouts' defaults are the agent's alone: stalwart.policy.timeouts).
DEFAULT_PG_TIMEOUT_S = 600.0
# In-place recovery: the bound on each wait of a re-formation (a survivor waiting for the agent's
# request, the new group forming, the state transfer); the agent's own bound derives from it.
DEFAULT_REFORM_TIMEOUT_S = 30.0
# Silent data corruption: the share of step time the cross-replica state checks may take, by default.
DEFAULT_SDC_BUDGET = 0.01

MAX_LINE = 4000  # < PIPE_BUF (4096): one write is atomic

# A stop request: the agent forwards these (as torchrun does), a scheduler sends them before preemption.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# The agent asks a worker for every thread's Python stack (faulthandler in the worker writes them).
STACK_DUMP_SIGNAL = signal.SIGUSR2
# The section a worker beats with while it saves or waits for a persist: checkpoint time, not a hang.
CHECKPOINT_SECTION = "checkpoint"


@dataclass(frozen=True)
class WorkerEnv:
    """Stalwart's part of a worker's environment (the torchrun part is :func:`elastic_env`)."""

    run_dir: str
    run_id: str
    node: str
    attempt: int
    ipc_fd: int = -1  # write end of the worker's message pipe; -1: none
    control: str = ""  # shared-memory control block
    agent_pid: int = 0
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S
    chaos: str = ""  # the fault plan as JSON
    mem_dir: str = ""  # this node's private tmpfs directory: memory tier and peer copies (agent-owned)
    peers: str = ""  # every node's peer store, ``node=host:port`` comma-separated, in group-rank order
    peer_secret: str = ""  # hex per-run secret that authenticates requests to the peer stores
    generation: int = 0  # the process group's generation this worker joins (> 0: an in-place replacement)
    reform_timeout_s: float = DEFAULT_REFORM_TIMEOUT_S  # bound on each wait of a re-formation; 0: not offered
    history_mtbf_s: float = 0.0  # this node's MTBF from its health history (0: none), for an auto interval
    sdc_every: int = 0  # steps between cross-replica state checks; 0: from sdc_budget; -1: off
    sdc_budget: float = DEFAULT_SDC_BUDGET  # the share of step time those checks may take
    leave_state: bool = True  # on a peer's failure, leave the live state for the restart (left_state.py)

    def to_env(self) -> dict[str, str]:
        return {
            f"{PREFIX}RUN_DIR": self.run_dir,
            f"{PREFIX}RUN_ID": self.run_id,
            f"{PREFIX}NODE": self.node,
            f"{PREFIX}ATTEMPT": str(self.attempt),
            f"{PREFIX}IPC": str(self.ipc_fd),
            f"{PREFIX}CONTROL": self.control,
            f"{PREFIX}AGENT_PID": str(self.agent_pid),
            f"{PREFIX}PG_TIMEOUT_S": repr(self.pg_timeout_s),
            f"{PREFIX}CHAOS": self.chaos,
            f"{PREFIX}MEM_DIR": self.mem_dir,
            f"{PREFIX}PEERS": self.peers,
            f"{PREFIX}PEER_SECRET": self.peer_secret,
            f"{PREFIX}GENERATION": str(self.generation),
            f"{PREFIX}REFORM_TIMEOUT_S": repr(self.reform_timeout_s),
            f"{PREFIX}HISTORY_MTBF_S": repr(self.history_mtbf_s),
            f"{PREFIX}SDC_EVERY": str(self.sdc_every),
            f"{PREFIX}SDC_BUDGET": repr(self.sdc_budget),
            f"{PREFIX}LEAVE_STATE": "1" if self.leave_state else "0",
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerEnv | None:
        """The agent's variables, or None when this process was not started by ``stalwart run``."""
        if not any(k.startswith(PREFIX) for k in env):
            return None
        try:
            return cls(
                run_dir=env.get(f"{PREFIX}RUN_DIR", ""),
                run_id=env.get(f"{PREFIX}RUN_ID", ""),
                node=env.get(f"{PREFIX}NODE", "local"),
                attempt=int(env.get(f"{PREFIX}ATTEMPT", "0")),
                ipc_fd=int(env.get(f"{PREFIX}IPC", "-1") or -1),
                control=env.get(f"{PREFIX}CONTROL", ""),
                agent_pid=int(env.get(f"{PREFIX}AGENT_PID", "0") or 0),
                pg_timeout_s=float(env.get(f"{PREFIX}PG_TIMEOUT_S", DEFAULT_PG_TIMEOUT_S)),
                chaos=env.get(f"{PREFIX}CHAOS", ""),
                mem_dir=env.get(f"{PREFIX}MEM_DIR", ""),
                peers=env.get(f"{PREFIX}PEERS", ""),
                peer_secret=env.get(f"{PREFIX}PEER_SECRET", ""),
                generation=int(env.get(f"{PREFIX}GENERATION", "0") or 0),
                reform_timeout_s=float(env.get(f"{PREFIX}REFORM_TIMEOUT_S", DEFAULT_REFORM_TIMEOUT_S)),
                history_mtbf_s=float(env.get(f"{PREFIX}HISTORY_MTBF_S", "0") or 0),
                sdc_every=int(env.get(f"{PREFIX}SDC_EVERY", "0") or 0),
                sdc_budget=float(env.get(f"{PREFIX}SDC_BUDGET", "") or DEFAULT_SDC_BUDGET),
                leave_state=env.get(f"{PREFIX}LEAVE_STATE", "1") != "0",
            )
        except ValueError:
            return None

    @property
    def peer_key(self) -> bytes:
        """The per-run secret for the peer stores as bytes (empty when there is none)."""
        return bytes.fromhex(self.peer_secret) if self.peer_secret else b""

    @staticmethod
    def strip(env: Mapping[str, str], settings: set[str]) -> dict[str, str]:
        """``env`` without the agent's own worker variables and without ``STALWART_<SETTING>``
        variables that configure a run: what a worker inherits from the agent's environment."""
        config = {f"STALWART_{s.upper()}" for s in settings}
        return {k: v for k, v in env.items() if not k.startswith(PREFIX) and k not in config}


def _env_int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        if env.get(name, "") != "":
            return int(env[name])
    return default


@dataclass(frozen=True)
class WorkerPlace:
    """Where a worker sits in the job, read back from the variables :func:`elastic_env` writes (and
    the attempt from ``WorkerEnv``); a plain ``python train.py`` is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0
    attempt: int = 0
    has_master: bool = False  # MASTER_ADDR is set: a process group can rendezvous

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerPlace:
        world = _env_int(env, "WORLD_SIZE", default=1)
        return cls(
            rank=_env_int(env, "RANK", default=0),
            world_size=world,
            local_rank=_env_int(env, "LOCAL_RANK", default=0),
            local_world_size=_env_int(env, "LOCAL_WORLD_SIZE", default=world),
            group_rank=_env_int(env, "GROUP_RANK", default=0),
            attempt=_env_int(env, f"{PREFIX}ATTEMPT", "TORCHELASTIC_RESTART_COUNT", default=0),
            has_master="MASTER_ADDR" in env,
        )


def elastic_env(
    *,
    rank: int,
    local_rank: int,
    world: int,
    local_world: int,
    group_rank: int,
    group_world: int,
    role: str,
    master_addr: str,
    master_port: int,
    restart_count: int,
    max_restarts: int,
    run_id: str,
    error_file: str,
    use_agent_store: bool = False,
) -> dict[str, str]:
    """The variables torchrun (torch.distributed.elastic's local agent) sets for each worker."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group_rank),
        "GROUP_WORLD_SIZE": str(group_world),
        "ROLE_NAME": role,
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(use_agent_store),
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


# --- messages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The worker uses the SDK: start-up and heartbeat timers apply to it. ``in_place``: its script
    runs under :meth:`stalwart.train.Session.run`, so it can re-form its process group in place."""

    rank: int
    t: float
    in_place: bool = False


@dataclass(frozen=True)
class Reforming:
    """A survivor left the broken process group of ``generation`` - 1 and waits to join
    ``generation``; ``abort_s``: from catching the failure to the group being torn down."""

    rank: int
    generation: int
    abort_s: float
    t: float


@dataclass(frozen=True)
class Reformed:
    """A rank joined the process group of ``generation`` and holds the live state after ``step``
    steps (``received`` bytes of it came over the group); ``phases`` are seconds per phase."""

    rank: int
    generation: int
    step: int
    received: int
    phases: dict[str, float]
    t: float


@dataclass(frozen=True)
class LoopStarted:
    """``leaves_state``: on a peer's failure the rank leaves its live state on the node on the way out
    (train/left_state.py), so the agent stops the group within its stop grace, not at once."""

    rank: int
    first_step: int
    total_steps: int
    t: float
    leaves_state: bool = False


@dataclass(frozen=True)
class StepBegan:
    rank: int
    step: int
    t: float


@dataclass(frozen=True)
class SectionBegan:
    rank: int
    step: int
    name: str
    t: float


@dataclass(frozen=True)
class StepDone:
    rank: int
    step: int
    t0: float
    duration: float
    sections: dict[str, float] = field(default_factory=dict)

    @property
    def t(self) -> float:
        return self.t0 + self.duration


class DurableKind(str, Enum):
    """Which save a ``CheckpointDone`` with an outcome reports."""

    STAGED = ""  # a save was staged; no outcome yet
    EMERGENCY = "emergency"  # the save on a stop request
    FINAL = "final"  # the state when the loop ends


@dataclass(frozen=True)
class CheckpointDone:
    """A save was staged (``durable`` None), or the outcome of making a step durable: the
    emergency save on a stop request, or the final state when the loop ends."""

    rank: int
    step: int
    t: float
    durable: bool | None = None  # None: staged only; True/False: committed to a durable tier or not
    reason: str = ""  # why not, when durable is False
    kind: DurableKind = DurableKind.STAGED  # EMERGENCY or FINAL when durable is set

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DurableKind(self.kind))  # from the wire: an unknown kind is garbled


@dataclass(frozen=True)
class PhaseChanged:
    """A long phase (evaluation, ...) begins (``budget_s`` > 0) or ends (``name`` empty)."""

    rank: int
    name: str
    budget_s: float
    t: float


@dataclass(frozen=True)
class Finished:
    rank: int
    steps: int
    preempted: bool
    t: float


@dataclass(frozen=True)
class SignalSeen:
    rank: int
    signum: int
    t: float


@dataclass(frozen=True)
class Note:
    rank: int
    text: str
    t: float


@dataclass(frozen=True)
class CorruptionFound:
    """The cross-replica check found silent data corruption after ``step`` steps (every rank sends
    it to its own agent, which decides whether its node is the one to quarantine)."""

    rank: int
    step: int
    verdict: str  # policy.sdc.ReplicaVerdict
    suspect_ranks: tuple[int, ...]
    suspect_nodes: tuple[str, ...]
    confidence: float
    t: float
    tensors: tuple[str, ...] = ()  # the differing state tensors (a few)

    def __post_init__(self) -> None:  # from the wire: JSON lists; a wrong type is garbled
        object.__setattr__(self, "suspect_ranks", tuple(int(r) for r in self.suspect_ranks))
        object.__setattr__(self, "suspect_nodes", tuple(str(n) for n in self.suspect_nodes))
        object.__setattr__(self, "tensors", tuple(str(n) for n in self.tensors))
        object.__setattr__(self, "confidence", float(self.confidence))


Message = (
    Hello
    | Reforming
    | Reformed
    | LoopStarted
    | StepBegan
    | SectionBegan
    | StepDone
    | CheckpointDone
    | PhaseChanged
    | Finished
    | SignalSeen
    | Note
    | CorruptionFound
)

_KINDS: dict[type, str] = {
    Hello: "hello",
    Reforming: "reforming",
    Reformed: "reformed",
    LoopStarted: "start",
    StepBegan: "step",
    SectionBegan: "sec",
    CheckpointDone: "ckpt",
    PhaseChanged: "phase",
    Finished: "fin",
    SignalSeen: "sig",
    Note: "note",
    CorruptionFound: "sdc",
}
_FIELDS: dict[str, tuple[type, dict[str, str]]] = {
    "hello": (Hello, {"ip": "in_place"}),
    "reforming": (Reforming, {"g": "generation", "a": "abort_s"}),
    "reformed": (Reformed, {"g": "generation", "s": "step", "b": "received", "p": "phases"}),
    "start": (LoopStarted, {"s": "first_step", "n": "total_steps", "ls": "leaves_state"}),
    "step": (StepBegan, {"s": "step"}),
    "sec": (SectionBegan, {"s": "step", "n": "name"}),
    "ckpt": (CheckpointDone, {"s": "step", "ok": "durable", "why": "reason", "kind": "kind"}),
    "phase": (PhaseChanged, {"n": "name", "b": "budget_s"}),
    "fin": (Finished, {"s": "steps", "pre": "preempted"}),
    "sig": (SignalSeen, {"sig": "signum"}),
    "note": (Note, {"text": "text"}),
    "sdc": (
        CorruptionFound,
        {
            "s": "step",
            "v": "verdict",
            "sr": "suspect_ranks",
            "sn": "suspect_nodes",
            "c": "confidence",
            "x": "tensors",
        },
    ),
}


def encode(msg: Message) -> bytes:
    """One line (with its newline), at most MAX_LINE bytes."""
    if isinstance(msg, StepDone):
        head = f"D {msg.rank} {msg.step} {msg.t0:.6f} {msg.duration:.6f}"
        line = " ".join([head, *(f"{n}={s:.6f}" for n, s in msg.sections.items())]) + "\n"
        return line.encode() if len(line) <= MAX_LINE else (head + "\n").encode()
    kind = _KINDS[type(msg)]
    names = _FIELDS[kind][1]
    out: dict[str, object] = {"k": kind, "r": msg.rank, "t": msg.t}
    for short, attr in names.items():
        out[short] = getattr(msg, attr)
    data = (json.dumps(out, separators=(",", ":")) + "\n").encode()
    if len(data) > MAX_LINE and isinstance(msg, Note):
        return encode(Note(msg.rank, msg.text[: MAX_LINE // 2], msg.t))
    if (
        len(data) > MAX_LINE and isinstance(msg, CorruptionFound) and msg.tensors
    ):  # the names are evidence only
        return encode(replace(msg, tensors=()))
    return data


def decode(line: bytes) -> Message | None:
    """The record of one line (without its newline), or None for a garbled or unknown line."""
    try:
        if line.startswith(b"D "):
            fields = line.decode().split()
            sections = {}
            for item in fields[5:]:
                name, _, secs = item.partition("=")
                sections[name] = float(secs)
            return StepDone(int(fields[1]), int(fields[2]), float(fields[3]), float(fields[4]), sections)
        data = json.loads(line)
        cls, names = _FIELDS[data["k"]]
        kwargs = {attr: data[short] for short, attr in names.items() if short in data}  # the rest: defaults
        message: Message = cls(rank=int(data["r"]), t=float(data["t"]), **kwargs)
        return message
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
