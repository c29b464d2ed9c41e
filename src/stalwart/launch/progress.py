"""What the agent knows of each worker's progress (collector state), and hang detection (pure)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

# sections that mostly wait for other ranks: a rank stuck there is a victim, not a culprit
_SECTION_RANK = {None: 0, "data": 1, "forward": 2, "backward": 3, "optimizer": 4, "checkpoint": 5}


@dataclass
class RankProgress:
    rank: int
    last_msg: float
    step: int = -1  # step in progress (or last begun)
    section: str | None = None
    done_steps: int = 0  # steps completed in this attempt
    finished: bool = False
    in_checkpoint: bool = False
    beat_t: float = 0.0  # time of the newest shared-memory heartbeat seen
    ckpt_t0: float = 0.0


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
    step_times: deque = field(default_factory=lambda: deque(maxlen=2000))
    ckpt_times: deque = field(default_factory=lambda: deque(maxlen=200))
    total_steps: int = 0
    first_step: int = -1
    max_done_step: int = -1
    signals: list[int] = field(default_factory=list)
    preempted_ranks: set = field(default_factory=set)

    def __post_init__(self) -> None:
        for r in self.ranks:
            self.progress[r] = RankProgress(rank=r, last_msg=self.started)

    def observe(self, msg: dict[str, Any], now: float) -> StepRecord | None:
        r = msg.get("r")
        p = self.progress.get(r)
        if p is None:
            return None
        # the sender's timestamp: the pipe is drained once a tick, so arrival can lag by a tick
        try:
            sent = float(msg.get("t", now))
        except (TypeError, ValueError):
            sent = now
        p.last_msg = min(max(sent, p.last_msg), now)
        kind = msg.get("k")
        if kind == "step":
            p.step = int(msg["s"])
            p.section = None
            if p.in_checkpoint:
                p.in_checkpoint = False
        elif kind == "sec":
            p.section = msg.get("n")
            if p.section == "checkpoint":
                p.in_checkpoint = True
                p.ckpt_t0 = p.last_msg
        elif kind == "ckpt":
            if p.in_checkpoint:
                self.ckpt_times.append(p.last_msg - p.ckpt_t0)
            p.in_checkpoint = False
            p.section = None
        elif kind == "done":
            rec = StepRecord(r, int(msg["s"]), float(msg["t0"]), float(msg["d"]), dict(msg.get("sec", {})))
            p.done_steps += 1
            p.section = None
            self.step_times.append(rec.duration)
            self.max_done_step = max(self.max_done_step, rec.step)
            return rec
        elif kind == "start":
            self.first_step = int(msg.get("s", 0))
            self.total_steps = int(msg.get("n", 0) or 0)
        elif kind == "fin":
            p.finished = True
            if msg.get("pre"):
                self.preempted_ranks.add(r)
        elif kind == "sig":
            self.signals.append(int(msg.get("sig", 0)))
        return None

    def observe_beat(self, rank: int, t: float, step: int, section: str, now: float) -> None:
        """A heartbeat read from the worker's shared-memory slot (only new beats change anything)."""
        p = self.progress.get(rank)
        if p is None or t <= p.beat_t:
            return
        p.beat_t = t
        p.last_msg = min(max(t, p.last_msg), now)
        p.step = step
        p.section = section or None
        if section == "checkpoint":
            if not p.in_checkpoint:
                p.ckpt_t0 = t
            p.in_checkpoint = True
        else:
            p.in_checkpoint = False

    def steps_seen(self) -> bool:
        return any(p.done_steps for p in self.progress.values())

    def max_step_in_progress(self) -> int:
        return max((p.step for p in self.progress.values()), default=-1)


@dataclass(frozen=True)
class HangVerdict:
    culprit: int
    silence_s: float
    timeout_s: float
    onset: float
    step: int
    evidence: str


def _position(p: RankProgress) -> tuple[int, int]:
    return (p.step, _SECTION_RANK.get(p.section, 2))


def detect_hang(tracker: ProgressTracker, now: float, timeout_s: float, phase: str) -> HangVerdict | None:
    """Return a verdict if some rank has been silent for ``timeout_s``; the culprit is the rank
    that is least advanced (others are usually blocked in a collective waiting for it)."""
    live = [p for p in tracker.progress.values() if not p.finished]
    if not live:
        return None
    silent = max(live, key=lambda p: now - p.last_msg)
    silence = now - silent.last_msg
    if silence < timeout_s:
        return None
    culprit = min(live, key=lambda p: (_position(p), p.last_msg))
    where = f"step {culprit.step}" if culprit.step >= 0 else "start-up"
    if culprit.section:
        where += f", section '{culprit.section}'"
    others = sorted({(p.step, p.section or "-") for p in live if p.rank != culprit.rank})
    others_txt = "; others at " + ", ".join(f"step {s} '{sec}'" for s, sec in others) if others else ""
    evidence = (
        f"rank {culprit.rank} silent {now - culprit.last_msg:.2f}s at {where} "
        f"(timeout {timeout_s:.2f}s, {phase}){others_txt}"
    )
    return HangVerdict(
        culprit.rank, now - culprit.last_msg, timeout_s, culprit.last_msg, culprit.step, evidence
    )
