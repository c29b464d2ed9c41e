"""What the agent knows of each worker's progress (collector state), and hang detection (pure)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from typing_extensions import assert_never

from ..diagnose.hang import RankPosition, attribute_hang
from ..protocol import (
    CheckpointDone,
    CorruptionFound,
    Finished,
    Hello,
    LoopStarted,
    Message,
    Note,
    PhaseChanged,
    Reformed,
    Reforming,
    SectionBegan,
    SignalSeen,
    StepBegan,
    StepDone,
)
from .processes.bootstrap import HOOK_SECTION

RATE_WINDOW = 20  # steps the progress line's rate is measured over


@dataclass
class RankProgress:
    rank: int
    last_msg: float
    step: int = -1  # step in progress (or last begun)
    section: str | None = None
    done_steps: int = 0  # steps completed in this attempt
    last_done: int = -1  # the newest step this rank completed
    finished: bool = False
    in_checkpoint: bool = False
    loop_done: bool = False  # past the loop's last step (or its final save): the script's own wrap-up
    beat_t: float = 0.0  # time of the newest shared-memory heartbeat seen
    ckpt_t0: float = 0.0
    sdk: bool = False  # the worker's messages count: it uses the SDK or its step hooks fired
    session: bool = False  # the worker said Hello: it runs the SDK's Session (a coordinated stop)
    hooked: bool = False  # a step came from the bootstrap's step hooks before any Hello: no Session
    phase: str = ""  # a long phase the script marked (evaluation, ...), with its own hang budget
    phase_budget_s: float = 0.0
    phase_t0: float = 0.0
    in_place: bool = False  # the script runs under Session.run: it can re-form its group in place
    leaves_state: bool = False  # on a peer's failure it leaves its live state on the node (left_state.py)
    reforming: Reforming | None = None  # the survivor left its group and waits for the next generation
    reformed: Reformed | None = None  # the rank joined the newest generation with the live state
    finished_at: float = 0.0  # when the rank said its training finished


@dataclass
class StepRecord:
    rank: int
    step: int
    start: float
    duration: float
    sections: dict[str, float]


@dataclass
class ProgressTracker:
    ranks: list[int]
    started: float
    progress: dict[int, RankProgress] = field(default_factory=dict)
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    ckpt_times: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    total_steps: int = 0
    first_step: int = -1
    max_done_step: int = -1
    signals: list[int] = field(default_factory=list)
    preempted_ranks: set[int] = field(default_factory=set)
    # rank -> CheckpointDone of its emergency or final save
    durability: dict[int, CheckpointDone] = field(default_factory=dict)
    # (end time, step) each time the job's newest completed step advanced: the job's rate
    advances: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW + 1))

    def __post_init__(self) -> None:
        for r in self.ranks:
            self.progress[r] = RankProgress(rank=r, last_msg=self.started)

    def observe(self, msg: Message, now: float) -> StepRecord | None:
        """Take one message from a worker; the step's record when it completes a step."""
        p = self.progress.get(msg.rank)
        if p is None or _hooked_in_session(p, msg):  # the SDK's own records count, not the hooks'
            return None
        # the sender's timestamp: the pipe is drained once a tick, so arrival can lag by a tick
        p.last_msg = min(max(msg.t, p.last_msg), now)
        match msg:
            case StepBegan():
                p.sdk = True
                p.step = msg.step
                p.section = None
                p.in_checkpoint = False
            case SectionBegan():
                self._section_began(p, msg)
            case CheckpointDone():
                self._checkpoint_done(p, msg)
            case StepDone():
                p.hooked = p.hooked or (HOOK_SECTION in msg.sections and not p.session)
                return self._step_done(p, msg)
            case Hello():
                p.sdk = p.session = True
                p.in_place = p.in_place or msg.in_place
            case Reforming():
                p.reforming = msg
            case Reformed():
                p.reformed = msg
            case LoopStarted():
                p.sdk = True
                p.loop_done = False
                p.leaves_state = msg.leaves_state
                self.first_step = msg.first_step
                self.total_steps = msg.total_steps
            case PhaseChanged():
                self._phase_changed(p, msg, now)
            case Finished():
                p.finished = True
                p.finished_at = now
                if msg.preempted:
                    self.preempted_ranks.add(msg.rank)
            case SignalSeen():
                self.signals.append(msg.signum)
            case Note() | CorruptionFound():  # shown, or acted on, by the supervisor
                pass
            case _:
                assert_never(msg)
        return None

    def replace(self, rank: int, now: float) -> None:
        """A new process took ``rank`` over (in-place recovery): its progress starts afresh."""
        old = self.progress.get(rank)
        self.progress[rank] = RankProgress(rank=rank, last_msg=now, in_place=old.in_place if old else False)

    def _section_began(self, p: RankProgress, msg: SectionBegan) -> None:
        p.sdk = True
        p.section = msg.name
        if p.section == "checkpoint":
            p.in_checkpoint = True
            p.ckpt_t0 = p.last_msg

    def _checkpoint_done(self, p: RankProgress, msg: CheckpointDone) -> None:
        if msg.durable is not None:
            self.durability[msg.rank] = msg
        if msg.kind == "final":
            p.loop_done = True
        if p.in_checkpoint:
            self.ckpt_times.append(p.last_msg - p.ckpt_t0)
        p.in_checkpoint = False
        p.section = None

    def _step_done(self, p: RankProgress, msg: StepDone) -> StepRecord:
        rec = StepRecord(msg.rank, msg.step, msg.t0, msg.duration, dict(msg.sections))
        p.sdk = True
        p.done_steps += 1
        p.last_done = max(p.last_done, rec.step)
        p.section = None
        if HOOK_SECTION in msg.sections:  # the hooks send no StepBegan: the rank is in the next step now
            p.step = max(p.step, msg.step + 1)
        self.step_times.append(rec.duration)
        if rec.step > self.max_done_step:
            self.advances.append((rec.start + rec.duration, rec.step))
        self.max_done_step = max(self.max_done_step, rec.step)
        if self.total_steps and rec.step + 1 >= self.total_steps:
            p.loop_done = True
        return rec

    def _phase_changed(self, p: RankProgress, msg: PhaseChanged, now: float) -> None:
        p.phase = msg.name
        p.phase_budget_s = msg.budget_s if msg.name else 0.0
        p.phase_t0 = msg.t
        if not msg.name:  # the ranks that waited for this phase count their silence from its end
            for q in self.progress.values():
                q.last_msg = max(q.last_msg, min(msg.t, now))

    def observe_beat(self, rank: int, t: float, step: int, section: str, now: float) -> None:
        """A heartbeat read from the worker's shared-memory slot (only new beats change anything)."""
        p = self.progress.get(rank)
        if p is None or t <= p.beat_t:
            return
        p.beat_t = t
        p.sdk = True
        p.last_msg = min(max(t, p.last_msg), now)
        p.step = step
        p.section = section or None
        if section == "checkpoint":
            if not p.in_checkpoint:
                p.ckpt_t0 = t
            p.in_checkpoint = True
        else:
            p.in_checkpoint = False

    def rate(self) -> float:
        """The job's steps per second over its newest steps, wall clock from step end to step end
        (data loading, evaluation between steps and every rank's wait included); 0 until two seen."""
        return job_rate(self.advances)

    def sdk_ranks(self) -> list[int]:
        """Ranks whose messages count (the SDK, or the bootstrap's step hooks): only their silence
        can be a hang by heartbeat."""
        return [r for r, p in self.progress.items() if p.sdk]

    def leaves_state(self, *failed: int) -> bool:
        """Whether a rank other than the ``failed`` ones leaves its live state on a peer's failure: then
        the group's stop waits (within the stop grace) for the survivors to write it."""
        return any(p.leaves_state for r, p in self.progress.items() if r not in failed)

    def session_ranks(self) -> list[int]:
        """Ranks that run the SDK's Session: only they take part in a coordinated stop."""
        return [r for r, p in self.progress.items() if p.session]

    def steps_seen(self) -> bool:
        return any(p.done_steps for p in self.progress.values())

    def max_step_in_progress(self) -> int:
        return max((p.step for p in self.progress.values()), default=-1)


def _hooked_in_session(p: RankProgress, msg: Message) -> bool:
    return p.session and isinstance(msg, StepDone) and HOOK_SECTION in msg.sections


def job_rate(advances: Iterable[tuple[float, int]]) -> float:
    """Steps per second between the oldest and newest (end time, step) of the window (pure)."""
    seen = list(advances)
    if len(seen) < 2:
        return 0.0
    (t0, s0), (t1, s1) = seen[0], seen[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass(frozen=True)
class HangVerdict:
    culprit: int
    silence_s: float
    timeout_s: float
    onset: float
    step: int
    evidence: str
    victims: tuple[int, ...] = ()  # live ranks other than the culprit (usually waiting for it)


def detect_hang(tracker: ProgressTracker, now: float, timeout_s: float, phase: str) -> HangVerdict | None:
    """Return a verdict if some rank has been silent for ``timeout_s``; the culprit is the rank
    that is least advanced (others are usually blocked in a collective waiting for it)."""
    return detect_hang_in(tracker.progress.values(), now, timeout_s, phase)


class RankState(Protocol):
    """What hang detection reads of a rank: a :class:`RankProgress` or the supervisor's frozen copy."""

    @property
    def rank(self) -> int: ...

    @property
    def last_msg(self) -> float: ...

    @property
    def step(self) -> int: ...

    @property
    def section(self) -> str | None: ...

    @property
    def finished(self) -> bool: ...

    @property
    def sdk(self) -> bool: ...

    @property
    def phase(self) -> str: ...

    @property
    def phase_budget_s(self) -> float: ...

    @property
    def phase_t0(self) -> float: ...


def detect_hang_in(
    ranks: Iterable[RankState], now: float, timeout_s: float, phase: str
) -> HangVerdict | None:
    """:func:`detect_hang` over rank views (``RankProgress`` or the supervisor's frozen copies).

    A long phase the script marked (evaluation) has its own budget; otherwise the culprit comes from
    :func:`stalwart.diagnose.hang.attribute_hang` over the ranks that use the SDK."""
    live = [p for p in ranks if not p.finished and p.sdk]
    if not live:
        return None
    phased = [p for p in live if p.phase and p.phase_budget_s > 0]
    if phased:
        # the others wait for the ranks in a long phase: its budget, from its start, is the timeout
        # for everyone, and only a rank that overruns its phase is to blame
        over = [p for p in phased if now - p.phase_t0 >= p.phase_budget_s]
        if not over:
            return None
        c = min(over, key=lambda p: p.phase_t0 + p.phase_budget_s)
        evidence = (
            f"rank {c.rank} in phase '{c.phase}' for {now - c.phase_t0:.2f}s, over its budget "
            f"{c.phase_budget_s:.2f}s (the other ranks wait for it)"
        )
        return HangVerdict(c.rank, now - c.last_msg, c.phase_budget_s, c.phase_t0, c.step, evidence)
    if max(now - p.last_msg for p in live) < timeout_s:
        return None
    positions = [RankPosition(p.rank, "", p.step, p.section, p.last_msg) for p in live]
    a = attribute_hang(positions, now, timeout_s, phase)
    if a is None:
        return None
    return HangVerdict(a.culprit, a.silence_s, timeout_s, a.onset, a.step, a.reason, a.victims)


def durability_problem(tracker: ProgressTracker, kind: str) -> str:
    """Why the ``kind`` ("emergency" or "final") save did not become durable on some rank, or ""."""
    return durability_problem_in(tracker.durability, kind)


def durability_problem_in(durability: Mapping[int, CheckpointDone], kind: str) -> str:
    """:func:`durability_problem` over the rank -> save map (the supervisor's snapshot holds one)."""
    bad = [d for d in durability.values() if d.kind == kind and not d.durable]
    if not bad:
        return ""
    d = min(bad, key=lambda x: x.rank)
    return f"rank {d.rank}: {d.reason or 'not committed'}"
