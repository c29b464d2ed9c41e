"""The hang monitor: SDK heartbeats (attribution by :func:`stalwart.diagnose.hang.attribute_hang`)
or, without the SDK, CPU progress; a hang incident. One of the agent's monitors (``monitors.py``)."""

from __future__ import annotations

import dataclasses
import signal
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from typing_extensions import assert_never

from ...diagnose.incident import BlastRadius, Incident
from ...diagnose.root_cause import component_class, incident_class
from ...diagnose.slow_link import Silence, judge_silence, link_window, slow_link_incident
from ...policy.hang_pin import HangCulprits, HangStop, HangStopKind
from ...policy.job import AttemptStatus
from ...policy.label import Label
from ...policy.restart_policy import Failure
from ...policy.timeouts import HangTimeout, HangTimeoutPolicy, hang_timeout
from ...policy.vocabulary import FailureKind
from ..cpu_progress import detect_cpu_stall
from ..decision import AttemptOutcome, Decision, DecisionKind
from ..ports import FailureFiles, WorkerProcesses
from ..progress import HangVerdict, detect_hang_in
from ..snapshot import Snapshot
from .straggler_monitor import StragglerMonitor


class HangSource(Label):
    """What a hang was detected from."""

    HEARTBEAT = "heartbeat"  # the SDK's messages and heartbeats stopped
    CPU = "cpu"  # a script without the SDK stopped using CPU

    @property
    def confidence(self) -> float:
        match self:
            case HangSource.HEARTBEAT:
                return 0.8
            case HangSource.CPU:
                return 0.6
            case _:
                assert_never(self)


class HangPhase(Label):
    """What the ranks are doing while the hang monitor watches: the silence allowed depends on it."""

    START_UP = "start-up"  # before the first step
    CHECKPOINT = "checkpoint"
    WRAP_UP = "wrap-up"  # past the loop's last step: the script's own code after the loop
    TRAINING = "training"


# how sure a crash's root cause is, by kind: an error record names the exception; a signal death
# says what killed the rank but not why; a lost peer says the cause is elsewhere


# --- hangs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HangMonitor:
    policy: HangTimeoutPolicy
    startup_timeout_s: float
    cpu_stall_s: float
    # a silent rank whose host's links still move this many bytes/s is on a slow link, not hung
    # (diagnose/slow_link.py); 0: off. Past ``link_ceiling_s`` (the collective's timeout) it is a hang.
    link_min_bps: float = 0.0
    link_ceiling_s: float = 0.0
    stragglers: StragglerMonitor | None = None  # acts on a slow link's verdict (keep, exclude, shrink)

    def phase(self, s: Snapshot) -> HangPhase:
        if not s.steps_seen:
            return HangPhase.START_UP
        if s.in_checkpoint:
            return HangPhase.CHECKPOINT
        # after the loop the script runs code of its own (saving the model, a last evaluation, tearing
        # down the process group) whose length the step times do not predict: the start-up budget applies
        return HangPhase.WRAP_UP if s.wrapping_up else HangPhase.TRAINING

    def timeout(self, s: Snapshot) -> tuple[HangTimeout, float]:
        """The calibrated hang timeout, and the silence allowed in the snapshot's phase."""
        ht = hang_timeout(s.step_times, self.policy)
        phase = self.phase(s)
        match phase:
            case HangPhase.TRAINING:
                return ht, ht.seconds
            case HangPhase.START_UP | HangPhase.CHECKPOINT | HangPhase.WRAP_UP:
                return ht, max(ht.seconds, self.startup_timeout_s)
            case _:
                assert_never(phase)

    def next_check(self, s: Snapshot) -> float:
        """When the next tick must come so a hang is never declared after its timeout."""
        live = [r.last_msg for r in s.ranks if not r.finished and r.sdk]
        if not s.sdk_ranks or not live:
            return s.now + s.tick
        # past the timeout (a slow link's silence is let run): the next tick, not a busy loop
        due = min(live) + self.timeout(s)[1] - s.tick
        return due if due > s.now else s.now + s.tick

    def __call__(self, s: Snapshot) -> Decision | None:
        # declare the hang up to one tick before the timeout, so that detection never lands after it,
        # whatever the poll phase (the supervisor also sleeps exactly to the deadline)
        if not s.sdk_ranks:
            # a stopped rank is evidence: caught after the hang floor; idleness alone only after
            # --cpu-stall (by default the process-group timeout)
            stopped_s = min(self.cpu_stall_s, self.policy.floor_s)
            stall = detect_cpu_stall(s.cpu, s.now + s.tick, self.cpu_stall_s, stopped_s)
            if stall is None:
                return None
            return _hang(
                s,
                stall.culprit,
                stall.onset,
                stall.evidence,
                "no step hook fired and no SDK in the script: hang detection by process state and CPU",
                -1,
                tuple(sorted(r for r in s.cpu if r != stall.culprit)),
                HangSource.CPU,
            )
        ht, seconds = self.timeout(s)
        v = detect_hang_in(s.ranks, s.now + s.tick, seconds, self.phase(s))
        if v is None:
            return None
        if self.link_min_bps > 0 and self.phase(s) is HangPhase.TRAINING:
            slow, decision = self._slow_link(s, v, ht.seconds)
            if slow:
                return decision
        return _hang(s, v.culprit, v.onset, v.evidence, ht.reason, v.step, v.victims, HangSource.HEARTBEAT)

    def _slow_link(self, s: Snapshot, v: HangVerdict, timeout_s: float) -> tuple[bool, Decision | None]:
        """Whether the silence is a slow link, and its decision (its incident once: later silences of
        a flagged rank pass with None)."""
        p = s.progress.get(v.culprit)
        peers = tuple(n for n in (s.world.active if s.world is not None else ()) if n != s.node)
        step_s = statistics.median(s.step_times) if s.step_times else 0.0
        ceiling = self.link_ceiling_s or self.cpu_stall_s
        silence = Silence(
            s.node, peers, v.culprit, p.section if p else None, v.silence_s, timeout_s, ceiling, step_s
        )
        verdict = judge_silence(silence, link_window(s.link, v.onset), self.link_min_bps)
        if not verdict.slow_link:
            return False, None
        if v.culprit in s.slow_links:
            return True, None  # flagged already: keep training, watched up to the ceiling
        incident = slow_link_incident(verdict, s.node, v.culprit, s.now, v.onset)
        mon = self.stragglers if self.stragglers is not None else StragglerMonitor()
        return True, mon.slow_link(s, v.culprit, verdict, incident, step_s)


def _hang(
    s: Snapshot,
    culprit: int,
    onset: float,
    evidence: str,
    why: str,
    step: int,
    victims: tuple[int, ...],
    how: HangSource,
) -> Decision:
    failure = Failure(
        kind=FailureKind.HANG,
        attempt=s.attempt,
        step=step,
        rank=culprit,
        evidence=evidence,
        progressed=s.steps_seen,
        sdk=bool(s.sdk_ranks),
    )
    fault_class, component = incident_class(component_class("hang", evidence))
    incident = Incident(
        cause=f"rank {culprit} stopped making progress; the other ranks wait for it",
        fault_class=fault_class,
        component=component,
        confidence=how.confidence,
        action="capture stacks and restart the workers (within the restart budget)",
        ts=s.now,
        onset=onset,
        rule=f"monitor:hang-{how}",
        evidence=(evidence, why) + ((f"waiting ranks: {', '.join(map(str, victims))}",) if victims else ()),
        blast_radius=BlastRadius(nodes=(s.node,), ranks=(culprit,)),
    )
    return Decision(
        DecisionKind.HANG,
        f"{evidence}; {why}",
        AttemptOutcome(AttemptStatus.FAILED, failure, s.now),
        incident,
        rank=culprit,
        onset=onset,
    )


def injected_hang(files: FailureFiles, group: WorkerProcesses, rank: int, local: Sequence[int]) -> str:
    """The chaos plan's entry that hung ``rank`` or, every rank of a hung group being silent, one of
    this node's ``local`` ranks (its worker left the entry under its pid), else ""."""
    for r in (rank, *local):
        try:
            found = files.injected_by(group.pid(r))
        except KeyError:  # a rank of another node
            continue
        if found:
            return found
    return ""


def stop_hang(group: WorkerProcesses, stop: HangStop, grace_s: float) -> None:
    """Stop a group that hung, as ``stop`` says (policy/hang_pin.py ``hang_stop``): the ranks it
    names first, the others within ``grace_s`` (they leave their live state once the collective they
    wait in fails on the killed ranks' closed connections); otherwise every rank at once (a held stop
    whose time ran out included)."""
    match stop.kind:
        case HangStopKind.HUNG_FIRST:
            first = [r for r in sorted(stop.first) if r in group.procs]
            if first:
                group.signal(signal.SIGKILL, first)
            group.stop(grace_s if first else 0.0)
        case HangStopKind.AT_ONCE | HangStopKind.HOLD:
            group.stop(0.0)
        case _:
            assert_never(stop.kind)


@dataclass(frozen=True)
class HeldHang:
    """A hang whose stop this node holds (``HangStopKind.HOLD``) until ``until``: the hung rank is on
    another node, and this node's ranks end by themselves once that node kills it."""

    decision: Decision
    stacks: Mapping[int, str]
    pinned: HangCulprits
    until: float
    reason: str


def pin_hang(d: Decision, pinned: HangCulprits) -> Decision:
    """The hang decision ``d`` on the rank the evidence pins it on. Every rank of a hung group falls
    silent, so the rank the monitor saw fall silent first is often a peer waiting for the hung one: a
    stopped rank, one that cannot dump its stack while its peers can, or one outside the collective
    its peers wait in is the hung one. The decision, and the failure a restart's reason is written
    from, then name that rank and what pinned it; unchanged when the evidence names none or agrees."""
    if not pinned.ranks or d.rank in pinned.ranks:
        return d
    rank = min(pinned.ranks)
    evidence = f"rank {rank} {pinned.evidence.says}; {d.reason}"
    outcome = d.outcome
    if outcome is not None and outcome.failure is not None:
        failure = dataclasses.replace(outcome.failure, rank=rank, evidence=evidence)
        outcome = dataclasses.replace(outcome, failure=failure)
    return dataclasses.replace(d, rank=rank, reason=evidence, outcome=outcome)
