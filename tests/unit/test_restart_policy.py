"""Restart decisions: infra budget, user-error budget, same-exception-twice, backoff."""

from __future__ import annotations

import pytest

from stalwart.exit_codes import EXIT_INFRA, EXIT_USER_ERROR
from stalwart.policy.restart_policy import Failure, RestartBudget, decide

BUDGET = RestartBudget(max_restarts=3, max_user_error_restarts=1, backoff_base_s=1.0, backoff_max_s=30.0)


def crash(attempt: int, step: int = 10, progressed: bool = True) -> Failure:
    return Failure("crash", attempt, step, rank=2, evidence="killed by SIGKILL", progressed=progressed)


def exc(attempt: int, step: int, sig: str = "ValueError: bad shape") -> Failure:
    return Failure("exception", attempt, step, rank=0, evidence="exit code 1", signature=sig, progressed=True)


def test_first_crash_restarts_without_backoff():
    d = decide([crash(0, step=1200)], BUDGET)
    assert d.action == "restart" and d.backoff_s == 0.0 and d.exit_code == 0
    assert d.infra_used == 1 and d.user_used == 0
    assert d.reason == "restart: crash of rank 2 at step 1200 (killed by SIGKILL); 1 of 3 restarts used"


def test_infra_budget_exhausted_stops_with_requeue_code():
    hist = [crash(i) for i in range(3)]
    assert decide(hist, BUDGET).action == "restart"
    hist.append(Failure("hang", 3, 40, rank=1, evidence="rank 1 silent 12s", progressed=True))
    d = decide(hist, BUDGET)
    assert d.action == "stop" and d.outcome == "infra_exhausted" and d.exit_code == EXIT_INFRA
    assert "hang at step 40" in d.reason and "(3 of 3)" in d.reason


def test_same_exception_same_step_twice_is_a_user_error():
    d1 = decide([exc(0, 7)], BUDGET)
    assert d1.action == "restart" and "1 of 1 user-error restarts used" in d1.reason
    d = decide([exc(0, 7), exc(1, 7)], RestartBudget(max_restarts=10, max_user_error_restarts=5))
    assert d.action == "stop" and d.outcome == "user_error" and d.exit_code == EXIT_USER_ERROR
    assert d.reason.startswith("user error at step 7: ValueError: bad shape")
    assert "attempts 0 and 1" in d.reason


def test_same_exception_at_another_step_is_not_the_same_bug():
    d = decide([exc(0, 7), exc(1, 8)], RestartBudget(max_restarts=10, max_user_error_restarts=5))
    assert d.action == "restart" and d.user_used == 2


def test_user_error_budget_counts_distinct_exceptions():
    d = decide([exc(0, 7, "KeyError: 'x'"), exc(1, 9, "IndexError: out of range")], BUDGET)
    assert d.action == "stop" and d.outcome == "user_error" and "2 exceptions, budget 1" in d.reason


def test_user_errors_do_not_draw_on_the_infra_budget():
    hist = [crash(0), crash(1), crash(2), exc(3, 50)]
    d = decide(hist, BUDGET)
    assert d.action == "restart" and d.infra_used == 3 and d.user_used == 1
    # and exceptions do not use up infra restarts
    d = decide([exc(0, 1, "A: a"), crash(1), crash(2), crash(3)], BUDGET)
    assert d.action == "restart" and d.infra_used == 3


def test_backoff_grows_while_attempts_make_no_progress_and_is_capped():
    budget = RestartBudget(max_restarts=20, backoff_base_s=1.0, backoff_max_s=5.0)
    hist = [crash(0, progressed=True)]
    got = []
    for a in range(1, 7):
        hist.append(crash(a, step=-1, progressed=False))
        got.append(decide(hist, budget).backoff_s)
    # one failed attempt without progress restarts at once; from the second on, base x 2^(n-2)
    assert got == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    d = decide(hist, budget)
    assert "backing off 5s after 6 attempts without progress" in d.reason and "start-up" in d.reason
    # progress resets the streak
    hist.append(crash(7, progressed=True))
    assert decide(hist, budget).backoff_s == 0.0


def test_no_history_is_an_error():
    with pytest.raises(ValueError):
        decide([], BUDGET)


def test_kinds_and_actions_are_enums_that_still_equal_their_strings():
    from stalwart.policy.restart_policy import RestartAction
    from stalwart.policy.vocabulary import FailureKind

    f = Failure("hang", 0, 3, 1, "silent")  # type: ignore[arg-type]  # a caller still passing the string
    assert f.kind is FailureKind.HANG and f.kind == "hang" and f"{f.kind}" == "hang"
    with pytest.raises(ValueError):
        Failure("flood", 0, 3, 1, "?")  # type: ignore[arg-type]
    d = decide([f], RestartBudget(max_restarts=0))
    assert d.action is RestartAction.STOP and d.action == "stop" and d.reason.startswith("hang at step 3")
