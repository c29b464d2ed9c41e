"""What a monitor returns (a :class:`Decision` with its reason) and how an attempt ended
(:class:`AttemptOutcome`). Both frozen: the supervisor applies a decision, it never edits one."""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnose.incident import Incident
from ..policy.job import AttemptStatus
from ..policy.label import Label
from ..policy.restart_policy import Failure
from ..protocol.error_record import ErrorRecord


@dataclass(frozen=True)
class AttemptOutcome:
    status: AttemptStatus
    failure: Failure | None = None
    detected_at: float = 0.0
    detail: str = ""  # why a save the verdict depends on did not commit; why the node was excluded
    step: int = -1  # the step the emergency or final save was for
    in_place: int = 0  # failures recovered in place during the attempt

    def __post_init__(self) -> None:  # monitors may still pass the status's string
        object.__setattr__(self, "status", AttemptStatus(self.status))


class DecisionKind(Label):
    """Decision kinds, and what the supervisor does for each."""

    # ending the attempt
    CRASH = "crash"  # stop the group at once, record the failure and its incident; outcome failed
    HANG = "hang"  # capture stacks, stop at once, record the failure and its incident; outcome failed
    FINISHED = "finished"  # every worker exited without a stop request: release hot spares; the outcome
    STOPPED_EXIT = "stopped_exit"  # every worker exited after a stop (signal or worker-side preemption)
    INTERRUPT = "interrupt"  # SIGINT: stop the group within its grace
    PASS_STOP = "pass_stop"  # a stop for a script without the SDK: stop the group within its grace
    DEADLINE = (
        "deadline"  # a bounded wait ran out (an emergency save; a finished rank's exit): stop within grace
    )
    MEMBERSHIP = "membership"  # a node waits to join: stop within grace and re-form
    EXCLUDE_STRAGGLER = "exclude_straggler"  # this node is the straggler: quarantine, stop at once, leave
    # continuing
    REQUEST_STOP = "request_stop"  # ask every rank to stop after ``stop_step`` (a coordinated emergency save)
    HOLD = "hold"  # an emergency save is under way: do nothing else this tick
    FORWARD_SIGNAL = "forward_signal"  # no SDK Session: pass the agent's signal to the workers at once
    STRAGGLERS = "stragglers"  # record stragglers that appeared or cleared (observe only)


ENDING = frozenset(
    {
        DecisionKind.CRASH,
        DecisionKind.HANG,
        DecisionKind.FINISHED,
        DecisionKind.STOPPED_EXIT,
        DecisionKind.INTERRUPT,
        DecisionKind.PASS_STOP,
        DecisionKind.DEADLINE,
        DecisionKind.MEMBERSHIP,
        DecisionKind.EXCLUDE_STRAGGLER,
    }
)
CONTINUING = frozenset(set(DecisionKind) - ENDING)


@dataclass(frozen=True)
class StragglerAdvice:
    """The straggler-action policy's verdict on one new straggler, as the ledger records it."""

    action: str  # observe_keep | observe_exclude_quarantine (observe only) | keep | exclude_quarantine
    reason: str  # the policy's reason with its costs, and the gate's
    incident: Incident

    @property
    def acted(self) -> bool:
        return not self.action.startswith("observe_")


@dataclass(frozen=True)
class Decision:
    kind: DecisionKind
    reason: str
    outcome: AttemptOutcome | None = None  # for the kinds that end the attempt
    incident: Incident | None = None  # crashes and hangs
    rank: int = -1  # the rank blamed (crash root cause, hang culprit)
    onset: float = 0.0
    exit_code: int = 0
    error: ErrorRecord | None = None  # the root rank's error record, when it left one
    stop_step: int = -1  # request_stop: the step after which every rank stops
    detected: tuple[tuple[int, float], ...] = ()  # stragglers: (rank, score) newly slow
    cleared: tuple[tuple[int, float], ...] = ()  # stragglers: (rank, score) no longer slow
    evidence: str = ""  # stragglers: the detector's reason
    # slow links: ranks raised as a slow link but never flagged (no host could be named), back at the
    # healthy pace: watched again, so the next slow silence is raised again
    healed: tuple[int, ...] = ()
    advice: tuple[StragglerAdvice, ...] = ()  # stragglers: the straggler-action policy's verdicts

    def __post_init__(self) -> None:
        try:  # monitors may still pass the kind's string
            object.__setattr__(self, "kind", DecisionKind(self.kind))
        except ValueError:
            raise ValueError(f"unknown decision kind {self.kind!r}") from None
        if (self.kind in ENDING) != (self.outcome is not None):
            raise ValueError(f"decision {self.kind!r}: an outcome exactly when it ends the attempt")

    @property
    def ends_attempt(self) -> bool:
        return self.kind in ENDING

    @property
    def ends_tick(self) -> bool:
        """Whether the supervisor asks no further monitor this tick."""
        return self.kind in ENDING or self.kind in (DecisionKind.HOLD, DecisionKind.FORWARD_SIGNAL)
