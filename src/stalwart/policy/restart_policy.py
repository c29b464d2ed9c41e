"""Restart decisions: a pure function of the failure history and the budgets.

Infrastructure faults (a worker killed by a signal, a hang, a lost peer or node) draw on
``max_restarts``. Exceptions raised by the training script draw on a separate, small budget, and
the same exception at the same step twice is a user bug: the job stops with a verdict instead of
burning every restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..exit_codes import EXIT_INFRA, EXIT_USER_ERROR
from .label import Label
from .vocabulary import FailureKind


class RestartAction(Label):
    RESTART = "restart"
    STOP = "stop"


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    attempt: int
    step: int  # step in progress, -1 if unknown
    rank: int
    evidence: str
    signature: str = ""  # "Type: message" for exceptions raised by user code
    progressed: bool = False  # whether the failed attempt completed any new step
    sdk: bool = True  # the script uses the SDK (else the step is unknown)

    def __post_init__(self) -> None:  # callers may still pass the kind's string
        object.__setattr__(self, "kind", FailureKind(self.kind))


@dataclass(frozen=True)
class RestartBudget:
    max_restarts: int = 3
    max_user_error_restarts: int = 1
    backoff_base_s: float = 1.0
    backoff_max_s: float = 30.0


@dataclass(frozen=True)
class RestartDecision:
    action: RestartAction
    reason: str
    outcome: str = ""  # for stop: user_error | infra_exhausted
    exit_code: int = 0
    backoff_s: float = 0.0
    infra_used: int = 0
    user_used: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", RestartAction(self.action))


def decide(history: Sequence[Failure], budget: RestartBudget) -> RestartDecision:
    """Decide what to do after ``history[-1]``; ``history`` is every failure of the job so far."""
    if not history:
        raise ValueError("decide() needs at least one failure")
    last = history[-1]
    user = [f for f in history if f.kind is FailureKind.EXCEPTION]
    infra = [f for f in history if f.kind is not FailureKind.EXCEPTION]
    where = (
        f"step {last.step}" if last.step >= 0 else ("start-up" if last.sdk else "an unknown step (no SDK)")
    )
    if last.kind is FailureKind.EXCEPTION:
        same = [f for f in user if f.signature == last.signature and f.step == last.step]
        if len(same) >= 2:
            attempts = " and ".join(str(f.attempt) for f in same[-2:])
            return RestartDecision(
                RestartAction.STOP,
                f"user error at {where}: {last.signature} (rank {last.rank}, same "
                f"exception at the same step in attempts {attempts}; a restart will not help)",
                "user_error",
                EXIT_USER_ERROR,
                0.0,
                len(infra),
                len(user) - 1,
            )
        if len(user) > budget.max_user_error_restarts:
            return RestartDecision(
                RestartAction.STOP,
                f"user error at {where}: {last.signature} (rank {last.rank}; "
                f"{len(user)} exceptions, budget {budget.max_user_error_restarts} restarts)",
                "user_error",
                EXIT_USER_ERROR,
                0.0,
                len(infra),
                len(user) - 1,
            )
    elif len(infra) > budget.max_restarts:
        return RestartDecision(
            RestartAction.STOP,
            f"{last.kind} at {where}: {last.evidence}; restart budget used up "
            f"({budget.max_restarts} of {budget.max_restarts})",
            "infra_exhausted",
            EXIT_INFRA,
            0.0,
            len(infra) - 1,
            len(user),
        )
    # back off exponentially while attempts fail without progress
    streak = 0
    for f in reversed(history):
        if f.progressed:
            break
        streak += 1
    backoff = 0.0 if streak <= 1 else min(budget.backoff_base_s * 2 ** (streak - 2), budget.backoff_max_s)
    used_infra = len(infra)
    used_user = len(user)
    if last.kind is FailureKind.EXCEPTION:
        budget_txt = f"{used_user} of {budget.max_user_error_restarts} user-error restarts used"
    else:
        budget_txt = f"{used_infra} of {budget.max_restarts} restarts used"
    reason = f"restart: {last.kind} of rank {last.rank} at {where} ({last.evidence}); {budget_txt}"
    if backoff:
        reason += f"; backing off {backoff:g}s after {streak} attempts without progress"
    return RestartDecision(RestartAction.RESTART, reason, "", 0, backoff, used_infra, used_user)
