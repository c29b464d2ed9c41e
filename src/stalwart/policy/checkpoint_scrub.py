"""Background verification of committed checkpoints (pure): which version to read next, when, and
what a reading means.

A committed version is immutable, so any difference between its files and the digests its manifest
recorded at commit is damage (a flipped bit in memory or on disk, a truncated or lost file), and a
recovery that reads it would reject it only when it is needed. The agent re-reads each committed
version off the training path (launch/checkpoint_scrub.py) and sets a damaged one aside, so a
recovery falls back to an older good version without trying it. These functions decide; they hold
no clock (``now`` comes in as an argument), read no file and start no thread.

A version's first verification is its persist: each rank took the SHA-256 of the files it had just
written, so reading them again at once would check the same bytes. It is read first ``recheck_s``
after the scrubber saw it committed, then every ``recheck_s`` after each clean reading, the versions
due in the order a recovery reads them (newest step first, fastest tier first), and no faster than
the budget: verifying uses at most ``duty`` of one CPU (a reading that used ``c`` seconds of CPU is
followed by the next no sooner than ``c / duty`` after it started). CPU time, not wall time: on a
loaded node a reading spends most of its wall time waiting for a CPU, which costs training nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .label import Label

DEFAULT_DUTY = 0.02  # 2% of one CPU, on a thread at a lowered CPU priority
DEFAULT_RECHECK_S = 0.5
SETTLE_S = 0.5  # a problem is judged again after this long: a version being deleted is gone by then


@dataclass(frozen=True)
class Budget:
    duty: float = DEFAULT_DUTY
    recheck_s: float = DEFAULT_RECHECK_S

    def __post_init__(self) -> None:
        if not 0.0 < self.duty <= 1.0:
            raise ValueError(f"scrub duty {self.duty} must be in (0, 1]")
        if self.recheck_s < 0:
            raise ValueError(f"scrub recheck {self.recheck_s} s must not be negative")


@dataclass(frozen=True)
class Version:
    """One committed version as the scrubber knows it."""

    tier: str
    speed: int  # 0 for the fastest tier (the loader reads a step's fastest copy first)
    step: int
    checked_at: float  # when it was last known good: first seen committed, then each clean reading

    @property
    def name(self) -> str:
        return f"{self.tier} step {self.step}"


def recovery_order(versions: Sequence[Version]) -> list[Version]:
    """The order a recovery reads versions in: newest step first, fastest tier first for one step."""
    return sorted(versions, key=lambda v: (-v.step, v.speed, v.tier))


class ScrubAction(Label):
    VERIFY = "verify"
    WAIT = "wait"


@dataclass(frozen=True)
class ScrubDecision:
    action: ScrubAction
    reason: str
    version: Version | None = None  # VERIFY: the version to read
    until: float = 0.0  # WAIT: when to ask again (the caller still looks for new versions sooner)


def rest_until(started: float, cpu_s: float, duty: float) -> float:
    """When the next verification may start, after one that started at ``started`` and used ``cpu_s``
    seconds of CPU: over every such cycle the CPU used is at most ``duty`` of the time."""
    return started + max(0.0, cpu_s) / duty


def next_verification(
    versions: Sequence[Version], *, now: float, rested_at: float, budget: Budget
) -> ScrubDecision:
    """The next version to read, or how long to wait. ``rested_at``: :func:`rest_until` of the last
    verification (0 before the first)."""
    if now < rested_at:
        return ScrubDecision(
            ScrubAction.WAIT,
            f"resting {rested_at - now:.2f}s: verification uses at most {budget.duty:.0%} of one CPU",
            until=rested_at,
        )
    ordered = recovery_order(versions)
    due = [v for v in ordered if now - v.checked_at >= budget.recheck_s]
    if due:
        v = due[0]
        return ScrubDecision(ScrubAction.VERIFY, f"{v.name} known good {now - v.checked_at:.1f}s ago, due", v)
    if not ordered:
        return ScrubDecision(ScrubAction.WAIT, "no committed version to verify", until=now + budget.recheck_s)
    soonest = min(v.checked_at for v in ordered) + budget.recheck_s
    return ScrubDecision(
        ScrubAction.WAIT,
        f"all {len(ordered)} version(s) known good within the last {budget.recheck_s:g}s",
        until=soonest,
    )


class ScrubVerdict(Label):
    """What one reading of a version found (the value is written to the ledger)."""

    CLEAN = "clean"  # every file matched its recorded size and digest
    DAMAGED = "damaged"  # the same committed version, read twice, does not match its manifest
    CHANGED = "changed"  # the version was replaced or removed while it was read: no verdict


@dataclass(frozen=True)
class Identity:
    """What tells one committed version directory from another of the same name: the directory's
    and its manifest's inode numbers and the manifest's modification time and size."""

    dir_inode: int
    manifest_inode: int
    manifest_mtime_ns: int
    manifest_size: int


@dataclass(frozen=True)
class Reading:
    """One verification of one version: the first problem found ("" when clean) and the version's
    identity before the reading and after it (None: gone). With a problem, ``after`` is taken
    :data:`SETTLE_S` later, so a version that was being deleted or replaced is seen as gone."""

    problem: str
    before: Identity | None
    after: Identity | None


class ScrubStep(Label):
    """What the scrubber does with a version after reading it."""

    KEEP = "keep"  # mark it verified now
    SET_ASIDE = "set_aside"  # move it out of every recovery's way and record the damage
    FORGET = "forget"  # read it again as a new version, if it is still there


@dataclass(frozen=True)
class ScrubOutcome:
    verdict: ScrubVerdict
    step: ScrubStep
    reason: str


def judge(version: Version, reading: Reading) -> ScrubOutcome:
    """Turn a reading into a verdict and what to do; only a problem found in a version whose identity
    held from before the reading until after the settle is damage."""
    same = reading.before is not None and reading.before == reading.after
    if not same:
        gone = "removed" if reading.after is None else "replaced"
        return ScrubOutcome(
            ScrubVerdict.CHANGED,
            ScrubStep.FORGET,
            f"{version.name} was {gone} while it was read (retention or a new save): no verdict",
        )
    if reading.problem:
        return ScrubOutcome(ScrubVerdict.DAMAGED, ScrubStep.SET_ASIDE, f"{version.name}: {reading.problem}")
    return ScrubOutcome(ScrubVerdict.CLEAN, ScrubStep.KEEP, f"{version.name} verified clean")


def fallback_line(nxt: Version | None, verified: bool) -> str:
    """What a recovery reads now that a damaged version is set aside, in words: ``nxt`` is the first
    version left in recovery order (None: none), ``verified`` whether it was read clean just now."""
    if nxt is None:
        return "no other committed version is left here: a restart from a checkpoint would begin at step 0"
    known = ", verified just now" if verified else ""
    return f"a recovery reads step {nxt.step} from the {nxt.tier} tier instead{known}"
