"""Which planned faults an unchanged script can take, and which ones never fired (pure).

An unchanged script (no Stalwart import) is instrumented by the worker bootstrap's optimizer step
hooks: they count steps, so every fault that fires at a step boundary in the worker (crash, exit,
raise, hang, slow) fires there too, and the agent's own ``kill-agent`` fires on the steps the hooks
report. Checkpoint damage needs a checkpoint Stalwart wrote, which only the SDK's Session writes: an
unchanged script cannot take it, and the run refuses it instead of dropping it silently.

A planned fault that never fired (its step lay past the run's last step, its rank never ran) is
reported at the end of the run, never left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from typing_extensions import assert_never

from ..errors import FaultPlanError
from .plan import Fault, FaultKind, FaultPlan


def hook_fires(kind: FaultKind) -> bool:
    """Whether a fault of ``kind`` fires for a script without the SDK (the bootstrap's step hooks)."""
    match kind:
        case FaultKind.CRASH | FaultKind.EXIT | FaultKind.RAISE | FaultKind.HANG | FaultKind.SLOW:
            return True  # the bootstrap's step hook fires it at the hook's own step count
        case FaultKind.KILL_AGENT:
            return True  # the agent fires it once the hooks report its step
        case FaultKind.CORRUPT_CHECKPOINT | FaultKind.TRUNCATE_CHECKPOINT:
            return False  # only the SDK writes a checkpoint Stalwart can reach
        case FaultKind.BITFLIP:
            return False  # only the SDK's loop holds the state it flips and checks
        case _:
            assert_never(kind)


def needs_sdk(plan: FaultPlan) -> tuple[Fault, ...]:
    """The plan's faults that an unchanged script cannot take."""
    return tuple(f for f in plan.faults if not hook_fires(f.kind))


def spec_of(fault: Fault) -> str:
    """The fault as a ``--chaos`` spec (what the user wrote, give or take the order of its keys)."""
    keys = [(k, getattr(fault, k)) for k in ("node", "rank", "step")]
    parts = [f"{k}={v}" for k, v in keys if v is not None]
    if fault.kind is FaultKind.SLOW:
        parts.append(f"factor={fault.factor:g}")
    if fault.on_failure:
        parts.append("on=failure")
    if fault.kind is FaultKind.BITFLIP:
        parts.append(f"target={fault.target}" + (f",bit={fault.bit}" if fault.bit >= 0 else ""))
    if fault.ident:
        parts.append(f"id={fault.ident}")
    return f"{fault.kind.value}@" + ",".join(parts)


def sdk_refusal(faults: Iterable[Fault], rank: int) -> FaultPlanError:
    """The one error that stops a run whose script runs without the SDK but was planned faults that
    need it (``rank``: the first rank seen stepping without a Session)."""
    names = ", ".join(f"'{spec_of(f)}'" for f in faults)
    many = "s" if "," in names else ""
    return FaultPlanError(
        f"fault{many} {names} need{'' if many else 's'} the Stalwart SDK (Session), but rank {rank} "
        "steps without one: an unchanged script has no checkpoint Stalwart can reach",
        "drop the fault from --chaos / run.toml's chaos, or run the script under stalwart.Session",
    )


@dataclass(frozen=True)
class Fired:
    """A ChaosInjected record, as far as matching it with the plan goes."""

    fault: str
    rank: int
    step: int


def _matches(fault: Fault, seen: Fired) -> bool:
    if seen.fault != fault.kind.value:
        return False
    if fault.kind.in_worker and seen.rank != fault.rank:
        return False
    if fault.kind is FaultKind.SLOW:  # announced at the first step it slowed, somewhere in its span
        return seen.step >= fault.start and (fault.stop is None or seen.step <= fault.stop)
    return seen.step == fault.step


def unfired(plan: FaultPlan, fired: Iterable[Fired]) -> tuple[Fault, ...]:
    """The plan's faults with no injection on record; each record accounts for one fault at most,
    and a fault that fired several times (``raise``, at every attempt) counts once."""
    pool = list(fired)
    missing: list[Fault] = []
    for fault in plan.faults:
        hit = next((i for i, seen in enumerate(pool) if _matches(fault, seen)), None)
        if hit is None:
            missing.append(fault)
            continue
        seen = pool.pop(hit)
        pool = [s for s in pool if s != seen or not _repeats(fault)]
    return tuple(missing)


def _repeats(fault: Fault) -> bool:
    return not fault.once


def unfired_line(faults: tuple[Fault, ...], last_step: int) -> str:
    """The console's and the report's one line about planned faults that never fired ("" if none)."""
    if not faults:
        return ""
    names = "; ".join(f"'{spec_of(f)}'" for f in faults)
    reached = f"the run's last step was {last_step}" if last_step >= 0 else "the run completed no step"
    return (
        f"chaos: {len(faults)} planned fault(s) never fired: {names} ({reached}; a fault past the "
        "last step, or on a rank that never ran, does not fire)"
    )
