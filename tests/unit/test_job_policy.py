"""The job policy (policy/job.py): every status to its decision, the restart budget, user errors, hot
spares, membership, shrink and replace; a pure function, so no process, clock or file."""

from __future__ import annotations

import signal

import pytest

from stalwart.exit_codes import (
    EXIT_INFRA,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_USER_ERROR,
)
from stalwart.policy import job
from stalwart.policy.job import (
    VERDICTS,
    AttemptStatus,
    End,
    JobSpec,
    JobState,
    Met,
    Outcome,
    RendezvousFailed,
    Replace,
    Restart,
    Shrink,
    StandBy,
    Unhealthy,
)
from stalwart.policy.restart_policy import Failure, RestartBudget
from stalwart.policy.vocabulary import FailureKind
from stalwart.policy.world_size import SizeRule, plan_world

NOW = 1_000.0


def state(node="n0", attempt=0, history=(), **spec) -> JobState:
    return JobState(JobSpec(node=node, **spec), attempt=attempt, history=tuple(history))


def crash(attempt: int, step: int = 5, progressed: bool = True) -> Failure:
    return Failure(FailureKind.CRASH, attempt, step, 0, "killed by SIGKILL", progressed=progressed)


def exception(attempt: int, step: int = 7) -> Failure:
    return Failure(FailureKind.EXCEPTION, attempt, step, 1, "raised", signature="ValueError: bad batch")


# --- every status of an attempt -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "out,outcome,code,text",
    [
        (
            Outcome(AttemptStatus.SUCCEEDED),
            "succeeded",
            EXIT_OK,
            "training finished after 3 attempts, 1 failure recovered",
        ),
        (
            Outcome(AttemptStatus.FINAL_UNSAVED, step=40, detail="disk full", newest_good=30),
            "final_unsaved",
            EXIT_INFRA,
            "final state (step 40) was NOT committed (disk full); newest good checkpoint: step 30",
        ),
        (
            Outcome(AttemptStatus.STOPPED, signal=signal.SIGUSR1),
            "preempted",
            EXIT_PREEMPTED,
            "preempted by SIGUSR1: the signal was passed to the workers",
        ),
        (Outcome(AttemptStatus.STOPPED), "preempted", EXIT_PREEMPTED, "preempted by SIGTERM"),
        (
            Outcome(AttemptStatus.PREEMPTED, step=12, newest_good=12),
            "preempted",
            EXIT_PREEMPTED,
            "preempted: emergency checkpoint of step 12 committed; requeue to resume",
        ),
        (
            Outcome(AttemptStatus.PREEMPTED, step=-1, newest_good=None),
            "preempted",
            EXIT_PREEMPTED,
            "preempted: emergency checkpoint committed",
        ),
        (
            Outcome(AttemptStatus.PREEMPTED, step=12, newest_good=10),
            "preempted_unsaved",
            EXIT_INFRA,
            "emergency checkpoint of step 12 does not verify on disk; newest good checkpoint: step 10",
        ),
        (
            Outcome(AttemptStatus.PREEMPTED, step=0, newest_good=5),
            "preempted_unsaved",
            EXIT_INFRA,
            "emergency checkpoint of step 0 does not verify on disk; newest good checkpoint: step 5",
        ),
        (
            Outcome(AttemptStatus.PREEMPTED_UNSAVED, detail="deadline", newest_good=None),
            "preempted_unsaved",
            EXIT_INFRA,
            "NOT committed (deadline); no good checkpoint on disk; a requeue resumes from there",
        ),
        (Outcome(AttemptStatus.INTERRUPTED), "aborted", EXIT_INTERRUPTED, "interrupted by the operator"),
        (
            Outcome(AttemptStatus.EXCLUDED, detail="a straggler (rank 3 is 2.1x slower)"),
            "node_excluded",
            EXIT_INFRA,
            "node n0 excluded and quarantined as a straggler (rank 3 is 2.1x slower)",
        ),
    ],
)
def test_each_ending_status_gives_its_verdict_and_exit_code(out, outcome, code, text):
    d = job.next(state(attempt=2, history=[crash(0)]), out, NOW)
    assert isinstance(d, End)
    assert (d.outcome, d.exit_code) == (outcome, code)
    assert text in d.verdict and d.reason == d.verdict
    assert d.left == (outcome == "node_excluded")


def test_every_status_has_a_decision():
    for status in AttemptStatus:
        failure = crash(0) if status is AttemptStatus.FAILED else None
        d = job.next(state(), Outcome(status, failure), NOW)
        assert isinstance(d, End | Restart), status


def test_a_status_string_is_taken_as_its_enum():
    out = Outcome("succeeded")  # type: ignore[arg-type]
    assert out.status is AttemptStatus.SUCCEEDED
    with pytest.raises(ValueError):
        Outcome("done")  # type: ignore[arg-type]


# --- failures and the restart budget ------------------------------------------------------------------


def test_a_failure_within_the_budget_restarts_the_whole_group_and_records_why():
    s = state(attempt=0, budget=RestartBudget(max_restarts=2))
    d = job.next(s, Outcome(AttemptStatus.FAILED, crash(0)), NOW)
    assert isinstance(d, Restart) and d.plan is None  # re-form the round, then start
    assert d.state.attempt == 1 and d.state.history == (crash(0),)
    (rec,) = d.records
    assert (rec.action, rec.restarts_used, rec.restarts_allowed, rec.ts) == ("restart", 1, 2, NOW)
    assert "1 of 2 restarts used" in d.reason and rec.reason == d.reason


def test_the_budget_used_up_ends_the_job_with_infra_exhausted():
    s = state(attempt=2, history=[crash(0), crash(1)], budget=RestartBudget(max_restarts=2))
    d = job.next(s, Outcome(AttemptStatus.FAILED, crash(2)), NOW)
    assert isinstance(d, End)
    assert (d.outcome, d.exit_code) == ("infra_exhausted", EXIT_INFRA)
    assert "restart budget used up (2 of 2)" in d.verdict
    assert d.records[0].action == "stop" and len(d.state.history) == 3


def test_the_same_exception_at_the_same_step_twice_stops_as_a_user_error():
    s = state(
        attempt=1, history=[exception(0)], budget=RestartBudget(max_restarts=10, max_user_error_restarts=5)
    )
    d = job.next(s, Outcome(AttemptStatus.FAILED, exception(1)), NOW)
    assert isinstance(d, End) and (d.outcome, d.exit_code) == ("user_error", EXIT_USER_ERROR)
    assert "same exception at the same step in attempts 0 and 1" in d.verdict


def test_failures_without_progress_back_off():
    budget = RestartBudget(max_restarts=10, backoff_base_s=2.0)
    s = state(attempt=1, history=[crash(0, progressed=False)], budget=budget)
    d = job.next(s, Outcome(AttemptStatus.FAILED, crash(1, progressed=False)), NOW)
    assert isinstance(d, Restart) and d.backoff_s == 2.0 and d.records[0].backoff_s == 2.0


def test_a_failed_outcome_without_its_failure_is_refused():
    with pytest.raises(ValueError):
        job.next(state(), Outcome(AttemptStatus.FAILED), NOW)


# --- membership ---------------------------------------------------------------------------------------


def test_a_node_waiting_to_join_re_forms_the_group_without_using_the_budget():
    d = job.next(state(attempt=3, history=[crash(0)]), Outcome(AttemptStatus.MEMBERSHIP), NOW)
    assert isinstance(d, Restart) and d.plan is None and d.backoff_s == 0.0
    assert d.state.attempt == 4 and d.state.history == (crash(0),)
    assert [r.action for r in d.records] == ["restart"] and "waiting to join" in d.reason


# --- before an attempt: gate, rendezvous, the world -----------------------------------------------------


def test_an_unhealthy_node_leaves_and_records_its_exclusion():
    d = job.next(state(), Unhealthy("xid 79", "quarantined"), NOW)
    assert isinstance(d, End) and d.left and (d.outcome, d.exit_code) == ("node_unhealthy", EXIT_INFRA)
    assert "excluded by the health gate: xid 79" in d.verdict
    (rec,) = d.records
    assert rec.action == "exclude_node" and rec.reason == "exclude node n0: xid 79 (node state quarantined)"


def test_a_failed_rendezvous_ends_the_job():
    d = job.next(state(), RendezvousFailed("TimeoutError: join timed out"), NOW)
    assert isinstance(d, End) and d.outcome == "rendezvous_failed" and not d.left
    assert d.verdict == "rendezvous failed: TimeoutError: join timed out" and d.exit_code == 75


def test_a_rendezvous_store_that_refuses_the_agent_is_bad_input_not_a_requeue():
    d = job.next(state(), RendezvousFailed("EtcdAccessError: no client certificate", refused=True), NOW)
    assert isinstance(d, End) and d.outcome == "rendezvous_failed" and d.exit_code == 2
    assert d.verdict == "the rendezvous store refused this agent: EtcdAccessError: no client certificate"


def test_a_rendezvous_that_failed_after_the_job_succeeded_elsewhere_ends_quietly_with_success():
    said = "the job already succeeded on h0 at 10:45:07 (the run directory's ledger says so)"
    d = job.next(state(), RendezvousFailed("DistStoreError: timed out", finished=said), NOW)
    assert isinstance(d, End) and d.outcome == "succeeded" and d.exit_code == 0 and not d.left
    assert d.verdict == f"{said}; this agent arrived at its end: nothing to join, nothing launched"


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, EXIT_PREEMPTED)])
def test_a_signal_before_start_ends_the_job(signum, code):
    d = job.next(state(), Met(("n0",), signum), NOW)
    assert isinstance(d, End) and d.outcome == "interrupted" and d.exit_code == code
    assert d.verdict == f"stopped by {signal.Signals(signum).name} before start"


def test_the_first_round_starts_the_whole_group_on_its_plan():
    d = job.next(state(), Met(("n0",)), NOW)
    assert isinstance(d, Restart) and d.plan is not None and d.plan.active == ("n0",)
    assert d.records == () and d.state.plan == d.plan and d.state.attempt == 0


def test_too_few_nodes_for_a_valid_world_ends_the_job():
    d = job.next(state(min_nodes=4, max_nodes=4), Met(("n0", "n1", "n2")), NOW)
    assert isinstance(d, End) and d.outcome == "rendezvous_failed" and d.exit_code == EXIT_INFRA
    assert "largest world size" in d.verdict  # the planner's reason: 2 nodes, below the minimum of 4


def test_the_leader_records_a_plan_that_leaves_nodes_out():
    spec = dict(max_nodes=4, size_rule=SizeRule())
    d = job.next(state("a", **spec), Met(("a", "b", "c")), NOW)  # 3 nodes: 2 active, 1 hot spare
    assert isinstance(d, Restart) and d.plan is not None and d.plan.active == ("a", "b")
    assert [r.action for r in d.records] == ["plan_world"] and "1 hot spare(s): c" in d.records[0].reason
    other = job.next(state("b", **spec), Met(("a", "b", "c")), NOW)
    assert other.records == ()  # only the first active node records the plan


# --- hot spares -----------------------------------------------------------------------------------------


def test_a_node_beyond_the_valid_size_stands_by():
    d = job.next(state("c", max_nodes=4), Met(("a", "b", "c")), NOW)
    assert isinstance(d, StandBy) and d.state.standing_by and d.plan.spares == ("c",)
    assert [r.action for r in d.records] == ["standby"] and d.records[0].reason.startswith("hot spare: ")


def _spare(node="c") -> JobState:
    d = job.next(state(node, max_nodes=4), Met(("a", "b", "c")), NOW)
    assert isinstance(d, StandBy)
    return d.state


def test_a_spare_leaves_with_success_when_the_job_is_done():
    d = job.next(_spare(), Outcome(AttemptStatus.SUCCEEDED), NOW)
    assert isinstance(d, End) and (d.outcome, d.exit_code) == ("succeeded", EXIT_OK)
    assert d.verdict == "the job finished while this node stood by as a hot spare"


def test_a_spare_re_joins_when_the_group_re_forms():
    d = job.next(_spare(), Outcome(AttemptStatus.MEMBERSHIP), NOW)
    assert isinstance(d, Restart) and d.plan is None and d.records == ()
    assert d.state.attempt == 1 and not d.state.standing_by


@pytest.mark.parametrize("status", [AttemptStatus.STORE_LOST, AttemptStatus.INTERRUPTED])
def test_a_spare_that_stops_otherwise_aborts(status):
    d = job.next(_spare(), Outcome(status), NOW)
    assert isinstance(d, End) and (d.outcome, d.exit_code) == ("aborted", EXIT_INFRA)
    assert d.verdict == f"hot spare stopped: {status.value}"


# --- the world changes: replace and shrink --------------------------------------------------------------


def _running(node: str, names: tuple[str, ...], **spec) -> JobState:
    d = job.next(state(node, **spec), Met(names), NOW)
    assert isinstance(d, Restart) and d.plan is not None
    return d.state


def test_a_spare_taking_a_lost_nodes_place_is_a_replace():
    s = _running("a", ("a", "b", "c"), max_nodes=2)  # a, b active; c a hot spare
    d = job.next(s, Met(("a", "c")), NOW)  # b is lost
    assert isinstance(d, Replace) and d.plan.active == ("a", "c")
    assert "c take(s) the place of b" in d.reason and "world size stays 2" in d.reason


def test_the_spare_itself_sees_its_step_in_as_a_replace():
    d = job.next(job.next(_spare(), Outcome(AttemptStatus.MEMBERSHIP), NOW).state, Met(("a", "c")), NOW)
    assert isinstance(d, Replace) and d.plan.active == ("a", "c") and not d.state.standing_by


def test_a_smaller_valid_world_is_a_shrink():
    s = _running("a", ("a", "b", "c", "d"), max_nodes=4)
    d = job.next(s, Met(("a", "b", "c")), NOW)  # d lost; 3 nodes: 2 is the largest power of two
    assert isinstance(d, Shrink) and d.plan.active == ("a", "b") and d.plan.spares == ("c",)
    assert "4 -> 2 node(s)" in d.reason


def test_the_same_world_again_is_a_restart_of_the_whole_group():
    s = _running("a", ("a", "b"), max_nodes=2)
    d = job.next(s, Met(("a", "b")), NOW)
    assert isinstance(d, Restart) and d.plan is not None and d.plan.active == ("a", "b")


def test_the_world_decisions_follow_the_shipped_world_size_policy():
    names = tuple(f"n{i}" for i in range(7))
    for k in range(1, len(names) + 1):
        d = job.next(state("n0", max_nodes=8, nproc_per_node=2), Met(names[:k]), NOW)
        want = plan_world(names[:k], 2, 1, 8, SizeRule())
        assert isinstance(d, Restart) and d.plan == want


def test_the_verdict_table_is_data_with_an_exit_code_each():
    assert all(isinstance(v.exit_code, int) and v.outcome and v.text for v in VERDICTS.values())
    assert {"succeeded", "preempted", "stopped", "excluded", "unhealthy"} <= set(VERDICTS)


def test_failures_recovered_in_place_count_in_the_success_verdict():
    first = job.next(state(), Outcome(AttemptStatus.SUCCEEDED, in_place=2), NOW)
    assert isinstance(first, End) and first.state.in_place == 2
    assert "after 1 attempt, 2 failures recovered" in first.verdict
