"""The job runner: asks the job policy (policy/job.py) what to do next and does only that.

Each round: the health gate (then, before the first rendezvous only, a place in a running group that
shrank in place and takes this node back: launch/inplace/rejoin.py), the rendezvous, the policy's world decision (start the whole group,
replace a lost node by a hot spare, shrink, stand by as a spare, or end), the attempt (or the spare's
wait), the policy's decision on its outcome (restart within the budget, or end with a verdict). Every
effect goes through a port (launch/ports.py): no process, socket or file here, so a unit test or the
simulator drives the runner over the fakes of launch/fakes.py on a manual clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from typing_extensions import assert_never

from ..errors import ConfigError
from ..events import DecisionTaken, JobEnded
from ..exit_codes import REQUEUE_HELPS
from ..policy import job
from ..policy.job import (
    NEEDS_NEWEST,
    AttemptStatus,
    End,
    JobDecision,
    JobState,
    Met,
    Outcome,
    RendezvousFailed,
    Replace,
    Restart,
    Shrink,
    StandBy,
    TookOver,
    Unhealthy,
)
from ..policy.world_size import WorldPlan
from .clock import Clock
from .decision import AttemptOutcome
from .ports import HealthGate, LedgerSink, Rendezvous, Round, RunFiles, WorkerLauncher

SPARE_POLL_S = 0.5  # how often a hot spare asks whether the job is done or re-forms


class NoGate:
    """Every node may start (no health gate)."""

    def check(self, attempt: int) -> tuple[str, str]:
        return "", ""


@dataclass
class JobRunner:
    state: JobState
    rendezvous: Rendezvous
    workers: WorkerLauncher
    files: RunFiles
    ledger: LedgerSink
    clock: Clock
    signal: Callable[[], int | None] = lambda: None
    gate: HealthGate = NoGate()
    on_attempt: Callable[[int], None] = lambda attempt: None  # the ledger's and the console's attempt
    # stops what the job started before its verdict is written, so the verdict is the ledger's last
    # event and its time the job's end (a final diagnosis after it was outside the report's wall time)
    closing: Callable[[End], None] = lambda end: None
    ended: End | None = None  # the decision the job ended with
    decided: list[JobDecision] = field(default_factory=list)  # every decision of the policy, in order

    def run(self) -> int:
        """Rounds until the policy ends the job; its exit code."""
        while True:
            decision = self._round()
            if isinstance(decision, End):
                return self.finish(decision)

    def _round(self) -> JobDecision:
        unhealthy, node_state = self.gate.check(self.state.attempt)
        if unhealthy:
            return self._ask(Unhealthy(unhealthy, node_state))
        if not self.decided:  # arrived while the job runs: a group that shrank in place may take it back
            back = self.workers.rejoin()
            if back is not None:
                return self._took_over(*back)
        try:
            met = self.rendezvous.meet()
        except Exception as exc:  # noqa: BLE001 - any rendezvous failure ends the job with a verdict
            text = str(exc).splitlines()[0] if str(exc) else ""
            refused = isinstance(exc, ConfigError)  # the store refused us (etcd's certificate, user)
            # a store gone with a job that succeeded: the run directory tells (bounded local read)
            finished = "" if refused else self.files.finished_elsewhere()
            return self._ask(RendezvousFailed(f"{type(exc).__name__}: {text}", refused, finished))
        decision = self._ask(Met(met.names, self.signal()))
        match decision:
            case End():
                return decision
            case StandBy(plan=plan):
                waited = self._stand_by(plan, met)
                if isinstance(waited, TookOver):  # a lost node's place, taken in place
                    return self._took_over(waited, met)
                return self._ask(waited)
            case Restart(plan=None):
                return decision  # the policy re-forms before it starts anything
            case Restart(plan=plan) | Replace(plan=plan) | Shrink(plan=plan) if plan is not None:
                return self._after(self._ask(self._attempt(plan, met)))
            case _:
                raise AssertionError(f"the job policy answered a round with {decision!r}")

    def _took_over(self, took: TookOver, met: Round) -> JobDecision:
        """A place in the running group, taken in place: this node's ranks join its next generation."""
        decision = self._ask(took)
        assert isinstance(decision, Replace)
        return self._after(self._ask(self._attempt(decision.plan, met)))

    def _after(self, decision: JobDecision) -> JobDecision:
        match decision:
            case End():
                return decision
            case Restart(backoff_s=backoff):
                if backoff:
                    self.clock.sleep(backoff)
                return decision
            case Replace() | Shrink() | StandBy():
                raise AssertionError(f"the job policy answered an attempt's outcome with {decision!r}")
            case _:
                assert_never(decision)

    def _ask(self, observation: job.Observation) -> JobDecision:
        """The policy's decision; its records go to the ledger under the attempt they were taken in."""
        decision = job.next(self.state, observation, self.clock.now())
        self.decided.append(decision)
        for r in decision.records:
            self.ledger.emit(
                DecisionTaken(
                    ts=r.ts,
                    action=r.action,
                    reason=r.reason,
                    restarts_used=r.restarts_used,
                    restarts_allowed=r.restarts_allowed,
                    backoff_s=r.backoff_s,
                    **self.ledger.ctx(),
                )
            )
        self.state = decision.state
        self.on_attempt(self.state.attempt)
        return decision

    def _attempt(self, plan: WorldPlan, met: Round) -> Outcome:
        out = self.workers.run(self.state.attempt, plan, met)
        return self._outcome(out)

    def _outcome(self, out: AttemptOutcome) -> Outcome:
        newest = self.files.newest_good() if out.status in NEEDS_NEWEST else None
        return Outcome(out.status, out.failure, out.step, out.detail, newest, self.signal(), out.in_place)

    def _stand_by(self, plan: WorldPlan, met: Round) -> Outcome | TookOver:
        """A hot spare: no workers; re-join when the active nodes re-form, leave when the job is done,
        or take a lost node's place in place (the launcher watches for one without waiting)."""
        while True:
            if self.signal() is not None:
                return Outcome(AttemptStatus.INTERRUPTED, signal=self.signal())
            took = self.workers.take_over(plan, met)
            if took is not None:
                return took
            try:
                if self.rendezvous.job_done():
                    return Outcome(AttemptStatus.SUCCEEDED)
                if (self.rendezvous.nodes_waiting() or 0) > 0:
                    return Outcome(AttemptStatus.MEMBERSHIP)
            except Exception:  # noqa: BLE001 - the store went away with the job
                return Outcome(AttemptStatus.STORE_LOST)
            self.clock.sleep(SPARE_POLL_S)

    def finish(self, end: End) -> int:
        """Stop what the job started, then write the verdict; the exit code."""
        self.ended = end
        self.closing(end)
        return write_verdict(self.ledger, self.clock, end.outcome, end.verdict, end.exit_code)


def write_verdict(ledger: LedgerSink, clock: Clock, outcome: str, verdict: str, exit_code: int) -> int:
    """The job's end in the ledger, with whether a requeue helps; the exit code."""
    ledger.emit(
        JobEnded(
            ts=clock.now(),
            verdict=verdict,
            outcome=outcome,
            exit_code=exit_code,
            requeue_helps=REQUEUE_HELPS.get(exit_code, False),
            **ledger.ctx(),
        )
    )
    return exit_code
