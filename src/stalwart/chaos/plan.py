"""Fault plans: which fault to inject where, parsed from flags or YAML and validated up front.

Flag syntax (``--chaos``, repeatable, or comma-separated)::

    crash@rank=1,step=40          the worker SIGKILLs itself at the start of step 40
    crash@rank=1,step=40,at=0.3   ... 0.3 of its step time into step 40 (crash and exit; a fault
                                  that strikes mid-step, as real ones do, not at a step boundary)
    exit@rank=1,step=40           the worker exits with code 1 (no traceback)
    raise@rank=0,step=30          the worker raises RuntimeError at step 30 (every attempt: a user bug)
    hang@rank=2,step=60           the worker stops making progress at step 60
    slow@rank=3,factor=1.5        rank 3 runs every step 1.5x slower (from=step, to=step optional)
    kill-agent@node=1,step=50     the agent with node index 1 SIGKILLs itself (and so its workers)
    bitflip@rank=1,step=30        flip one bit of one of rank 1's weights after step 30 (silent data
                                  corruption); target=param|grad|optim (a gradient just before the
                                  optimizer step, or an optimizer state tensor), bit=N (default: the
                                  lowest exponent bit of the tensor's type, which doubles or halves it)
    corrupt-checkpoint@step=70    flip bytes in the newest committed checkpoint once step 70 is reached
    truncate-checkpoint@step=70   truncate a file of the newest committed checkpoint
    corrupt-checkpoint@step=70,on=failure
                                  ... at the first failed attempt from step 70 on: the newest version
                                  committed when the workers are gone, the very one a restart reads

Checkpoint damage waits while a newer version is on its way (being written, or committed in the
node memory tier and not yet on disk), or until the attempt fails: the version it damages is then
the one a restart would read. Faults fire once per run (a marker file in the run directory
records it), except ``raise``,
which fires at every attempt because it models a deterministic bug.

YAML: a list of mappings with ``fault:`` and the same keys, or ``{faults: [...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from typing_extensions import assert_never

from ..errors import FaultPlanError
from ..inputs import parse_yaml, read_text_file
from ..policy.label import Label


class FaultKind(Label):
    """What a fault does; its value is the name in ``--chaos`` specs, YAML plans and the ledger."""

    CRASH = "crash"  # the worker SIGKILLs itself
    EXIT = "exit"  # the worker exits with code 1
    RAISE = "raise"  # the worker raises (every attempt: a deterministic bug)
    HANG = "hang"  # the worker stops making progress
    SLOW = "slow"  # the worker's steps take ``factor`` times as long
    KILL_AGENT = "kill-agent"  # the agent SIGKILLs itself (and so its workers)
    CORRUPT_CHECKPOINT = "corrupt-checkpoint"  # the agent flips bytes in the newest checkpoint
    TRUNCATE_CHECKPOINT = "truncate-checkpoint"  # the agent truncates a file of the newest checkpoint
    BITFLIP = "bitflip"  # the worker flips a bit of its model, gradient or optimizer state (SDC)

    @property
    def in_worker(self) -> bool:
        """Fired by the worker (the SDK's session); else by the agent."""
        match self:
            case (
                FaultKind.CRASH
                | FaultKind.EXIT
                | FaultKind.RAISE
                | FaultKind.HANG
                | FaultKind.SLOW
                | FaultKind.BITFLIP
            ):
                return True
            case FaultKind.KILL_AGENT | FaultKind.CORRUPT_CHECKPOINT | FaultKind.TRUNCATE_CHECKPOINT:
                return False
            case _:
                assert_never(self)

    @property
    def once(self) -> bool:
        """Fires once per run (a marker file records it); ``raise`` models a bug and fires at every
        attempt, ``slow`` holds for a span of steps."""
        match self:
            case FaultKind.RAISE | FaultKind.SLOW:
                return False
            case (
                FaultKind.CRASH
                | FaultKind.EXIT
                | FaultKind.HANG
                | FaultKind.KILL_AGENT
                | FaultKind.CORRUPT_CHECKPOINT
                | FaultKind.TRUNCATE_CHECKPOINT
                | FaultKind.BITFLIP
            ):
                return True
            case _:
                assert_never(self)


WORKER_FAULTS = tuple(k for k in FaultKind if k.in_worker)
AGENT_FAULTS = tuple(k for k in FaultKind if not k.in_worker)
KINDS = WORKER_FAULTS + AGENT_FAULTS
_KEYS = {"rank", "step", "factor", "node", "from", "to", "id", "at", "on", "target", "bit"}
FLIP_TARGETS = ("param", "grad", "optim")  # what a bitflip corrupts
MAX_BIT = 63
MAX_FAULTS = 1000  # a plan is a handful of faults; thousands are a mistake (and blow the env size)
MAX_PLAN_BYTES = 1 << 20
MAX_SPEC_CHARS = 1000
MAX_INDEX = 2**31 - 1  # ranks, steps and node indexes


@dataclass(frozen=True)
class Fault:
    kind: FaultKind  # also given as its name ("crash"): converted on construction
    rank: int | None = None
    step: int | None = None
    node: int | None = None
    factor: float = 1.0
    start: int = 0  # for slow: first slowed step
    stop: int | None = None  # for slow: last slowed step (inclusive)
    ident: str = ""
    at: float = 0.0  # crash, exit: how far into the step it strikes, as a fraction of the step time
    on_failure: bool = False  # checkpoint damage: strike when an attempt fails, not when the step comes
    target: str = ""  # bitflip: param | grad | optim ("" for the others)
    bit: int = -1  # bitflip: the bit flipped; -1: the lowest exponent bit of the tensor's type

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FaultKind(self.kind))

    @property
    def once(self) -> bool:
        return self.kind.once

    def marker(self) -> str:
        return self.ident or f"{self.kind}-r{self.rank}-s{self.step}-n{self.node}"

    def describe(self) -> str:
        if self.kind is FaultKind.SLOW:
            span = f"steps {self.start}-{self.stop}" if self.stop is not None else f"from step {self.start}"
            return f"slow rank {self.rank} x{self.factor:g} ({span})"
        where = []
        if self.node is not None:
            where.append(f"node {self.node}")
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.step is not None:
            where.append(f"step {self.step}")
        into = f" ({self.at:g} of the way through)" if self.at else ""
        if self.kind is FaultKind.BITFLIP:
            into = f" ({self.target}, bit {self.bit if self.bit >= 0 else 'lowest exponent'})"
        when = ", at the first failure from then on" if self.on_failure else ""
        return f"{self.kind} at " + ", ".join(where) + into + when


@dataclass(frozen=True)
class FaultPlan:
    faults: tuple[Fault, ...] = ()

    def for_rank(self, rank: int) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.kind.in_worker and f.rank == rank)

    def agent_faults(self) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if not f.kind.in_worker)

    def to_json(self) -> str:
        return json.dumps([asdict(f) for f in self.faults])  # a kind is written as its value

    @staticmethod
    def from_json(text: str) -> FaultPlan:
        return FaultPlan(tuple(Fault(**d) for d in json.loads(text)))

    def describe(self) -> list[str]:
        return [f.describe() for f in self.faults]

    def check_world(self, world_size: int, nnodes: int) -> None:
        """Refuse faults aimed at a rank or node index the job does not have (they would never fire)."""
        for f in self.faults:
            if f.rank is not None and f.rank >= world_size:
                raise FaultPlanError(
                    f"fault '{f.describe()}' targets rank {f.rank}, but the job has ranks 0..{world_size - 1}"
                )
            if f.node is not None and f.node >= nnodes:
                raise FaultPlanError(
                    f"fault '{f.describe()}' targets node {f.node}, but the job has nodes 0..{nnodes - 1}"
                )


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _int(kind: str, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise FaultPlanError(f"fault {kind!r}: {key}={_shown(value)} is not an integer")
    try:
        out = int(value) if isinstance(value, int) else int(value.strip()) if len(value) <= 20 else None
    except ValueError:
        out = None
    if out is None:
        raise FaultPlanError(f"fault {kind!r}: {key}={_shown(value)} is not an integer")
    if out < 0:
        raise FaultPlanError(f"fault {kind!r}: {key}={out} must be >= 0")
    if out > MAX_INDEX:
        raise FaultPlanError(f"fault {kind!r}: {key}={out} must be at most {MAX_INDEX}")
    return out


def make_fault(kind: str, params: Mapping[str, object]) -> Fault:
    name = kind.strip().lower().replace("_", "-")
    try:
        fault_kind = FaultKind(name)
    except ValueError:
        raise FaultPlanError(f"unknown fault {_shown(name)}", f"use one of: {', '.join(KINDS)}") from None
    unknown = {str(k)[:40] for k in params if k not in _KEYS}
    if unknown:
        raise FaultPlanError(
            f"fault {name!r}: unknown key(s) {', '.join(sorted(unknown)[:5])}",
            f"allowed: {', '.join(sorted(_KEYS))}",
        )
    rank = _int(name, "rank", params["rank"]) if "rank" in params else None
    step = _int(name, "step", params["step"]) if "step" in params else None
    node = _int(name, "node", params["node"]) if "node" in params else None
    factor = _factor(name, params["factor"]) if "factor" in params else 1.0
    _check_needs(fault_kind, rank, step, node, factor)
    start = _int(name, "from", params["from"]) if "from" in params else 0
    stop = _int(name, "to", params["to"]) if "to" in params else None
    if stop is not None and stop < start:
        raise FaultPlanError(f"fault 'slow': to={stop} is before from={start}")
    at = _fraction(fault_kind, params["at"]) if "at" in params else 0.0
    on_failure = _on(fault_kind, params["on"]) if "on" in params else False
    target, bit = _flip_of(fault_kind, params)
    return Fault(
        kind=fault_kind,
        rank=rank,
        step=step,
        node=node,
        factor=factor,
        start=start,
        stop=stop,
        ident=_ident(name, params.get("id", "")),
        at=at,
        on_failure=on_failure,
        target=target,
        bit=bit,
    )


def _flip_of(kind: FaultKind, params: Mapping[str, object]) -> tuple[str, int]:
    """A bitflip's ``target=`` (param by default) and ``bit=`` (-1: the lowest exponent bit)."""
    if kind is not FaultKind.BITFLIP:
        if "target" in params or "bit" in params:
            raise FaultPlanError(f"fault {kind.value!r} takes no target= or bit= (only bitflip does)")
        return "", -1
    target = str(params.get("target", "param")).strip().lower()
    if target not in FLIP_TARGETS:
        raise FaultPlanError(
            f"fault 'bitflip': target={_shown(target)} is not known", f"use one of: {', '.join(FLIP_TARGETS)}"
        )
    bit = _int("bitflip", "bit", params["bit"]) if "bit" in params else -1
    if bit > MAX_BIT:
        raise FaultPlanError(f"fault 'bitflip': bit={bit} must be at most {MAX_BIT}")
    return target, bit


def _on(kind: FaultKind, raw: object) -> bool:
    """``on=failure``: checkpoint damage that strikes when an attempt fails (the version a restart
    reads, whatever committed in the meantime), not when its step is reached."""
    if kind not in (FaultKind.CORRUPT_CHECKPOINT, FaultKind.TRUNCATE_CHECKPOINT):
        raise FaultPlanError(
            f"fault {kind.value!r} takes no on= (only checkpoint damage waits for a failure)", "drop on="
        )
    if str(raw).strip().lower() != "failure":
        raise FaultPlanError(f"fault {kind.value!r}: on={_shown(raw)} is not known", "use on=failure")
    return True


def _fraction(kind: FaultKind, raw: object) -> float:
    """``at=``: a fraction of the step in [0, 1), for the faults a timer can fire mid-step (a kill)."""
    name = kind.value
    if kind not in (FaultKind.CRASH, FaultKind.EXIT):
        raise FaultPlanError(
            f"fault {name!r} takes no at= (only crash and exit strike mid-step)", "drop at=, or use crash"
        )
    value = _factor(name, raw, key="at")
    if not 0.0 <= value < 1.0:
        raise FaultPlanError(f"fault {name!r}: at={value:g} must be in [0, 1), a fraction of the step")
    return value


def _factor(name: str, raw: object, key: str = "factor") -> float:
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)) or len(str(raw)) > 30:
            raise ValueError
        value = float(raw)
    except (ValueError, OverflowError):
        raise FaultPlanError(f"fault {name!r}: {key}={_shown(raw)} is not a number") from None
    if value != value:  # NaN passes every range check
        raise FaultPlanError(f"fault {name!r}: {key}=nan is not a number")
    return value


def _check_needs(
    kind: FaultKind, rank: int | None, step: int | None, node: int | None, factor: float
) -> None:
    """Refuse a fault without what it needs to fire: a worker fault its rank, every fault but ``slow``
    its step, ``kill-agent`` its node, ``slow`` a factor in (1, 100]."""
    name = kind.value
    if kind.in_worker and rank is None:
        raise FaultPlanError(f"fault {name!r} needs rank=", f"e.g. {name}@rank=1,step=40")
    if kind is not FaultKind.SLOW and step is None:
        raise FaultPlanError(f"fault {name!r} needs step=", f"e.g. {name}@rank=1,step=40")
    match kind:
        case FaultKind.KILL_AGENT:
            if node is None:
                raise FaultPlanError(
                    "fault 'kill-agent' needs node= (the agent's node index)",
                    "e.g. kill-agent@node=1,step=50",
                )
        case FaultKind.SLOW:
            if not 1.0 < factor <= 100.0:
                raise FaultPlanError(
                    f"fault 'slow': factor={factor:g} must be in (1, 100]", "e.g. slow@rank=3,factor=1.5"
                )
        case (
            FaultKind.CRASH
            | FaultKind.EXIT
            | FaultKind.RAISE
            | FaultKind.HANG
            | FaultKind.CORRUPT_CHECKPOINT
            | FaultKind.TRUNCATE_CHECKPOINT
            | FaultKind.BITFLIP
        ):
            pass
        case _:
            assert_never(kind)


def _ident(kind: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FaultPlanError(f"fault {kind!r}: id={_shown(value)} must be a short name")
    text = str(value)
    if len(text) > 64 or not all(c.isalnum() or c in "-_." for c in text):
        raise FaultPlanError(
            f"fault {kind!r}: id={_shown(value)} must be a short name", "letters, digits, -_."
        )
    return text


def parse_spec(spec: str) -> Fault:
    """Parse one ``kind@key=value,key=value`` spec."""
    spec = spec.strip()
    if not spec:
        raise FaultPlanError("empty fault spec", "e.g. crash@rank=1,step=40")
    if len(spec) > MAX_SPEC_CHARS:
        raise FaultPlanError(f"fault spec of {len(spec):,} characters (at most {MAX_SPEC_CHARS})")
    kind, _, rest = spec.partition("@")
    params: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not value:
            raise FaultPlanError(
                f"bad fault spec {spec!r}: {part!r} is not key=value", "e.g. crash@rank=1,step=40"
            )
        params[key.strip()] = value.strip()
    return make_fault(kind, params)


def split_specs(specs: list[str]) -> list[str]:
    """Flags may hold several specs: ``crash@rank=1,step=4;hang@rank=0,step=9``."""
    out: list[str] = []
    for s in specs:
        out.extend(p for p in s.split(";") if p.strip())
    return out


def load_plan_file(path: str | Path) -> FaultPlan:
    p = Path(path)
    text = read_text_file(p, MAX_PLAN_BYTES, "fault plan", error=FaultPlanError)
    data = parse_yaml(text, f"fault plan {p}", error=FaultPlanError)
    if isinstance(data, dict) and "faults" in data:
        data = data["faults"]
    if not isinstance(data, list):
        raise FaultPlanError(f"fault plan {p} must be a list of faults (or {{faults: [...]}})")
    if len(data) > MAX_FAULTS:
        raise FaultPlanError(f"fault plan {p} has {len(data):,} faults (at most {MAX_FAULTS})")
    faults = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "fault" not in item:
            raise FaultPlanError(
                f"fault plan {p}: entry {i} needs a 'fault:' key", "e.g. - {fault: crash, rank: 1, step: 40}"
            )
        if not isinstance(item["fault"], str):
            raise FaultPlanError(f"fault plan {p}: entry {i}: 'fault:' must be a fault name, e.g. crash")
        params = {k: v for k, v in item.items() if k != "fault"}
        faults.append(make_fault(item["fault"], params))
    return FaultPlan(tuple(faults))


def build_plan(specs: list[str] | None = None, plan_file: str | Path | None = None) -> FaultPlan:
    faults: list[Fault] = []
    if plan_file:
        faults.extend(load_plan_file(plan_file).faults)
    flags = split_specs(specs or [])
    if len(faults) + len(flags) > MAX_FAULTS:
        raise FaultPlanError(f"the fault plan has {len(faults) + len(flags):,} faults (at most {MAX_FAULTS})")
    for s in flags:
        faults.append(parse_spec(s))
    markers = [f.marker() for f in faults]
    if len(set(markers)) != len(markers):
        raise FaultPlanError("the fault plan lists the same fault twice", "give duplicates distinct id=")
    return FaultPlan(tuple(faults))
