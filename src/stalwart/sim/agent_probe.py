"""The agent's decision path, driven on a manual clock: what the simulator asks it.

The simulator must not re-implement the agent, so it asks the agent's own supervisor
(:class:`stalwart.launch.attempt.supervisor.Supervisor`), with the agent's own monitors in their priority
order (:func:`stalwart.launch.attempt.monitors.default_monitors`), and the agent's own job runner and job policy
(:class:`stalwart.launch.runner.JobRunner`, :func:`stalwart.policy.job.next`), on a
:class:`~stalwart.launch.clock.ManualClock` and over the fakes of the agent's ports
(:mod:`stalwart.launch.fakes`, the same the unit tests use). No process, no thread, no sleeping: the
clock moves only when the probe or the supervisor's own ``sleep`` moves it.

* :func:`hang_latency`: two ranks complete steps of ``step_s`` seconds (the messages go through the
  supervisor's collector into its progress tracker, which calibrates the hang timeout); then rank 1
  never begins the next step and rank 0 begins it and waits for rank 1 in its collective. The first
  instant at which the monitors decide ``hang`` is found by bisection over the time of the frozen
  snapshot (the hang monitor is monotone in the silence); the latency is that instant minus rank 1's
  last progress. The supervisor's real loop is then run from a tick before it, so the decision is
  also applied through the ports (``applied_at``: its loop sleeps to the deadline, and its minimum
  sleep of 1 ms can land it that much later when the clock's arithmetic rounds just short). The hang
  monitor declares a hang up to one monitor tick early, never late (``HangMonitor``), so the answer
  is ``hang_timeout - monitor_interval_s`` (the agent's default tick, 0.05 s).
* :func:`restart_stop`: the agent's job runner over one node, one supervised attempt per round: two
  ranks complete a step, then rank 0 is killed (SIGKILL: an infrastructure ``crash``). The job policy
  appends the failure to the job's history and asks the restart policy; the first attempt after which
  it ends the job is the period. The first :data:`SUPERVISED_ATTEMPTS` attempts are each supervised;
  beyond them (large budgets) the job policy is asked over the history grown with the supervisor's last
  failure record, re-stamped with the attempt number, and the first end is found by galloping and
  bisection (the decision is monotone: a history that ends the job still ends it one failure later).
* :func:`world_after_loss`: world size and hot spares. The job runner of a node that survives meets
  the whole pool (active nodes, then spares), its attempt fails as the lost nodes go, and it meets the
  survivors: the job policy replaces the lost nodes by spares, shrinks to a smaller valid world, or
  ends the job because no valid world is left.

Each answer is computed once per distinct input and cached; the engine folds the answers into its
vectorised arrays.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..events import FailureDetected
from ..launch.attempt.monitors import decide
from ..launch.attempt.supervisor import Supervisor
from ..launch.clock import ManualClock
from ..launch.decision import AttemptOutcome
from ..launch.fakes import (
    FakeBlock,
    FakeFailureFiles,
    FakeGroup,
    FakeJobLink,
    FakePipe,
    FakeRendezvous,
    FakeRunFiles,
    RecordingConsole,
    RecordingLedger,
    ScriptedChaos,
    ScriptedWorkers,
    specs,
)
from ..launch.ports import Round, WorkerLauncher
from ..launch.runner import JobRunner
from ..policy import job
from ..policy.job import AttemptStatus, End, JobDecision, JobSpec, JobState, Outcome, Replace, Restart, Shrink
from ..policy.restart_policy import Failure, RestartBudget
from ..policy.timeouts import HangTimeoutPolicy
from ..policy.vocabulary import FailureKind
from ..policy.world_size import SizeRule, WorldPlan
from ..protocol import StepBegan, StepDone
from ..settings.recovery import InPlaceSettings
from ..settings.run_config import default_of
from ..settings.schema import CheckpointSettings, DiagnosisSettings, HangSettings, WorkerSettings

T0 = 1_000_000.0
RANKS = (0, 1)
NODE = "sim0"
MONITOR_INTERVAL_S: float = default_of("monitor_interval_s")
SUPERVISED_ATTEMPTS = 32  # attempts each run through a supervisor; beyond, the recorded failure repeats
MAX_BUDGET_PROBE = 100_000  # the largest restart period looked for (the simulator's max_restarts bound)
MAX_TICKS = 1_000  # bound on one supervised attempt's loop
BISECT_ROUNDS = 80


@dataclass(frozen=True)
class ProbeConfig:
    """The part of the run configuration the supervisor and its monitors read: the agent's own
    settings models (settings/schema.py), so the probe runs with the agent's defaults."""

    hang_policy: HangTimeoutPolicy = HangTimeoutPolicy()
    monitor_interval_s: float = MONITOR_INTERVAL_S
    hang: HangSettings = HangSettings()
    workers: WorkerSettings = WorkerSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    diagnosis: DiagnosisSettings = DiagnosisSettings(interval_s=0.0)  # the agent raises its own incidents
    # the probe's fake ranks never offer in place: the ladder below it is what the probe times
    reform: InPlaceSettings = InPlaceSettings(enabled=False)
    min_nodes: int = 1
    max_nodes: int = 1
    size_rule: SizeRule = SizeRule()
    nproc_per_node: int = len(RANKS)  # read only by in-place moves across nodes, which the probe never makes


class _Rig:
    """One attempt: a real supervisor over two fake ranks on a manual clock, its events recorded."""

    def __init__(self, cfg: ProbeConfig, attempt: int, clock: ManualClock, script=None) -> None:
        self.clock = clock
        self.group = FakeGroup.of(RANKS)
        self.pipe = FakePipe()
        self.ledger = RecordingLedger(run_id="sim", node=NODE, attempt=attempt)
        self.script = script
        self.chaos = ScriptedChaos(self._workers, max_ticks=MAX_TICKS)
        self.sup = Supervisor(
            cfg=cfg,
            ledger=self.ledger,
            console=RecordingConsole(),
            files=FakeFailureFiles(),
            job=FakeJobLink(),
            chaos=self.chaos,
            group=self.group,
            receiver=self.pipe,
            block=FakeBlock(refuse_stop="probe: the agent was never signalled, yet a stop was requested"),
            specs=specs(RANKS),
            clock=clock,
            attempt=attempt,
            node=NODE,
            read_proc=lambda pid: None,
        )

    def _workers(self, tick: int) -> None:  # once per supervisor tick: the workers' side of the tick
        if self.script is not None:
            self.script(self)

    @property
    def ticks(self) -> int:
        return self.chaos.ticks

    @property
    def events(self) -> list:
        return self.ledger.events

    def step(self, step: int, duration: float, ranks=RANKS) -> None:
        """Ranks ``ranks`` completed step ``step`` just now, after ``duration`` seconds."""
        now = self.clock.now()
        for r in ranks:
            self.pipe.queue += [
                StepBegan(r, step, now - duration),
                StepDone(r, step, now - duration, duration, {"forward": duration}),
            ]


# --- hang detection -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HangProbe:
    latency_s: float  # the first instant the monitors decide "hang" minus the hung rank's last progress
    applied_at: float  # when the supervisor's loop, run up to it, detected and applied the hang
    last_progress: float
    reason: str  # the decision's reason, with the calibrated timeout and why


@lru_cache(maxsize=256)
def hang_latency(
    step_s: float, policy: HangTimeoutPolicy, monitor_interval_s: float = MONITOR_INTERVAL_S
) -> HangProbe:
    """How long after a rank's last progress the agent decides it hung, for steps of ``step_s``."""
    cfg = ProbeConfig(hang_policy=policy, monitor_interval_s=monitor_interval_s)
    clock = ManualClock(T0)
    rig = _Rig(cfg, attempt=0, clock=clock)
    # calibration: every rank completes steps of step_s, seen by the supervisor's collector
    steps = max(policy.min_samples, 1) + 1
    for k in range(steps):
        clock.advance(step_s)
        rig.step(k, step_s)
        snap = rig.sup.gather()
        ended = [d for d in decide(snap, rig.sup.monitors) if d.ends_attempt]
        if ended:
            raise RuntimeError(f"probe: training steps ended the attempt ({ended[0].reason})")
    # the hang: rank 1 never begins the next step; rank 0 begins it and waits for rank 1 in the collective
    clock.advance(min(step_s, monitor_interval_s) / 2)
    rig.pipe.queue.append(StepBegan(0, steps, clock.now()))
    base = rig.sup.gather()
    last = rig.sup.tracker.progress[1].last_msg

    def hung(t: float) -> bool:
        return any(d.kind == "hang" for d in decide(dataclasses.replace(base, now=t), rig.sup.monitors))

    lo, hi = last, last + max(policy.cap_s, policy.startup_s, cfg.hang.startup_s) + 2 * monitor_interval_s
    if hung(lo) or not hung(hi):
        raise RuntimeError(
            "probe: the monitors decide a hang with no silence, or none after the longest timeout"
        )
    for _ in range(BISECT_ROUNDS):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (lo, mid) if hung(mid) else (mid, hi)
    # the supervisor's own loop from a tick before: it decides, applies (hooks) and records the time
    clock.advance(max(0.0, lo - monitor_interval_s - clock.now()))
    out: AttemptOutcome = rig.sup.run()
    if out.failure is None or out.failure.kind != "hang":
        raise RuntimeError(f"probe: the supervisor ended the attempt with {out.status}, not a hang")
    detected = [e for e in rig.events if isinstance(e, FailureDetected)]
    if out.failure.rank != 1 or not detected:
        raise RuntimeError(f"probe: the hang was blamed on rank {out.failure.rank}, not the silent rank 1")
    return HangProbe(hi - last, out.detected_at, last, detected[-1].evidence)


# --- restart budget -------------------------------------------------------------------------------


def supervised_crash(attempt: int, cfg: ProbeConfig = ProbeConfig()) -> Failure:
    """One attempt under the supervisor: two ranks complete a step, then rank 0 is killed (SIGKILL);
    the failure record of the attempt's outcome (an infrastructure crash of a rank that progressed)."""
    out = _supervised_kill(attempt, cfg)
    if out.failure is None:
        raise RuntimeError(f"probe: a killed rank ended the attempt with {out.status}, not a failure")
    return out.failure


def _supervised_kill(attempt: int, cfg: ProbeConfig = ProbeConfig()) -> AttemptOutcome:
    clock = ManualClock(T0)

    def workers(rig: _Rig) -> None:
        if rig.ticks == 1:
            rig.step(0, cfg.monitor_interval_s / 2)
        elif rig.ticks == 3:
            rig.group.codes[0] = -signal.SIGKILL
            rig.group.exit_times[0] = clock.now()

    return _Rig(cfg, attempt=attempt, clock=clock, script=workers).sup.run()


class _SupervisedKills:
    """The worker launcher of the probe: every attempt supervised, rank 0 killed after a step."""

    def run(self, attempt: int, plan: WorldPlan, met: Round) -> AttemptOutcome:
        return _supervised_kill(attempt)

    def take_over(self, plan: WorldPlan, met: Round) -> None:
        return None  # the probe has no hot spare

    def rejoin(self) -> None:
        return None  # nor a running group to join


@dataclass(frozen=True)
class RestartProbe:
    period: int | None  # the failure after which the agent ends the job; None: it never does
    supervised: int  # how many of the failures ran through a supervisor
    decision: End | None  # the job policy's end, with its outcome and reason (the restart policy's)


def _runner(
    spec: JobSpec, rendezvous: FakeRendezvous, workers: WorkerLauncher, clock: ManualClock
) -> JobRunner:
    return JobRunner(
        state=job.initial(spec),
        rendezvous=rendezvous,
        workers=workers,
        files=FakeRunFiles(),
        ledger=RecordingLedger(run_id="sim", node=spec.node),
        clock=clock,
    )


@lru_cache(maxsize=256)
def restart_stop(budget: RestartBudget | None, supervised: int = SUPERVISED_ATTEMPTS) -> RestartProbe:
    """Successive infrastructure failures through the supervisor, and the job policy's decision after
    each, until it ends the job."""
    if budget is None:  # no budget in the agent: a cluster manager restarts, the agent never stops
        return RestartProbe(None, 0, None)
    spec = JobSpec(node=NODE, budget=budget)
    rounds: list[Sequence[str] | BaseException] = [(NODE,)] * supervised
    runner = _runner(spec, FakeRendezvous(rounds), _SupervisedKills(), ManualClock(T0))
    runner.run()
    ended = runner.ended
    assert ended is not None
    history = list(runner.state.history)
    if ended.outcome != "rendezvous_failed":  # the job policy ended the job within the supervised rounds
        if not history or ended.state.history != tuple(history):
            raise RuntimeError(f"probe: the job ended without a failure: {ended.verdict}")
        return RestartProbe(len(history), len(history), ended)
    last = history[-1]

    def at(k: int) -> JobDecision:
        """The job policy's decision on the ``k``-th failure."""
        history.extend(dataclasses.replace(last, attempt=a) for a in range(len(history), k))
        state = JobState(spec, attempt=k - 1, history=tuple(history[: k - 1]))
        return job.next(state, Outcome(AttemptStatus.FAILED, failure=history[k - 1]), T0)

    lo = hi = supervised
    while not isinstance(at(hi), End):
        if hi >= MAX_BUDGET_PROBE:
            return RestartProbe(None, supervised, None)
        lo, hi = hi, min(2 * hi, MAX_BUDGET_PROBE)
    while hi - lo > 1:  # at(lo) restarts, at(hi) ends
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if isinstance(at(mid), End) else (mid, hi)
    end = at(hi)
    assert isinstance(end, End)
    return RestartProbe(hi, supervised, end)


# --- world size and hot spares ---------------------------------------------------------------------


@dataclass(frozen=True)
class WorldProbe:
    runnable: bool  # whether a valid world is left
    active: int  # nodes in the world after the loss (0 when it cannot run)
    decision: str  # replace | shrink | restart | end: the job policy's decision on the survivors' round
    reason: str


@lru_cache(maxsize=1024)
def world_after_loss(
    nodes: int, spares: int, nproc_per_node: int, min_nodes: int, rule: SizeRule, lost: int
) -> WorldProbe:
    """The job policy's world after the first ``lost`` nodes of the pool (``nodes`` that may be active,
    then ``spares``) go: asked by the runner of a surviving node (a spare when every active node is lost)."""
    names = tuple(f"n{i}" for i in range(nodes + spares))
    if lost >= len(names):
        return WorldProbe(False, 0, "end", "every node of the pool is lost")
    spec = JobSpec(
        node=names[lost], nproc_per_node=nproc_per_node, min_nodes=min_nodes, max_nodes=nodes, size_rule=rule
    )
    gone = set(names[:lost])
    failure = Failure(FailureKind.PEER_LOST, 0, -1, 0, f"lost {lost} node(s)")

    def attempt(n: int, plan: WorldPlan) -> AttemptOutcome:  # a world with a lost node fails
        if gone & set(plan.active):
            return AttemptOutcome(AttemptStatus.FAILED, dataclasses.replace(failure, attempt=n))
        return AttemptOutcome(AttemptStatus.SUCCEEDED)

    rounds: list[Sequence[str] | BaseException] = [names, names[lost:]]
    runner = _runner(
        spec, FakeRendezvous(rounds, waiting_at=1), ScriptedWorkers(outcome=attempt), ManualClock(T0)
    )
    runner.run()
    seen = runner.decided
    world = [d for d in seen if isinstance(d, Replace | Shrink | Restart) and d.plan is not None]
    ended = runner.ended
    assert ended is not None
    if ended.outcome != "succeeded" or not world:
        return WorldProbe(False, 0, "end", ended.verdict)
    last = world[-1]
    assert last.plan is not None
    kind = {Replace: "replace", Shrink: "shrink", Restart: "restart"}[type(last)]
    return WorldProbe(True, len(last.plan.active), kind, last.reason)
