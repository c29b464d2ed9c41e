"""The agent's decision path, driven on a manual clock: what the simulator asks it.

The simulator must not re-implement the agent, so it asks the agent's own supervisor
(:class:`stalwart.launch.supervisor.Supervisor`), with the agent's own monitors in their priority
order (:func:`stalwart.launch.monitors.default_monitors`), on a :class:`~stalwart.launch.clock.ManualClock`
and with recording fakes for everything the supervisor touches (worker group, message pipe, control
block, the agent's :class:`~stalwart.launch.supervisor.Hooks`). No process, no thread, no sleeping:
the clock moves only when the probe or the supervisor's own ``sleep`` moves it.

* :func:`hang_latency`: two ranks complete steps of ``step_s`` seconds (the messages go through the
  supervisor's collector into its progress tracker, which calibrates the hang timeout); then rank 1
  never begins the next step and rank 0 begins it and waits for rank 1 in its collective. The first
  instant at which the monitors decide ``hang`` is found by bisection over the time of the frozen
  snapshot (the hang monitor is monotone in the silence); the latency is that instant minus rank 1's
  last progress. The supervisor's real loop is then run from a tick before it, so the decision is
  also applied through the hooks (``applied_at``: its loop sleeps to the deadline, and its minimum
  sleep of 1 ms can land it that much later when the clock's arithmetic rounds just short). The hang
  monitor declares a hang up to one monitor tick early, never late (``HangMonitor``), so the answer
  is ``hang_timeout - monitor_interval_s`` (the agent's default tick, 0.05 s).
* :func:`restart_stop`: one attempt per failure, as the agent runs them: a fresh supervisor per
  attempt, two ranks complete a step, then rank 0 is killed (SIGKILL: an infrastructure ``crash``).
  The supervisor's outcome carries the failure record; the agent appends it to the job's history and
  asks :func:`stalwart.launch.restart_policy.decide` (exactly the agent's call). The first attempt
  whose decision is ``stop`` is the period. The first :data:`SUPERVISED_ATTEMPTS` attempts are each
  supervised; beyond them (large budgets) the history grows with the supervisor's last failure record,
  re-stamped with the attempt number, and the first stop is found by galloping and bisection (the
  decision is monotone: a history that stops the job still stops it one failure later).

Each answer is computed once per distinct input and cached; the engine folds the answers into its
vectorised arrays. World size and hot spares are not here: the supervisor has no path for them (the
agent re-plans the world at the rendezvous, outside the supervisor), so ``sim/policies.py`` asks the
shipped ``launch.world_size`` policy directly.
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass, field
from functools import lru_cache
from types import SimpleNamespace

from ..events import FailureDetected
from ..launch.clock import ManualClock
from ..launch.config import default_of
from ..launch.decision import AttemptOutcome
from ..launch.supervisor import Hooks, Supervisor, decide
from ..policy.restart_policy import Failure, RestartBudget, RestartDecision
from ..policy.restart_policy import decide as restart_decide
from ..policy.timeouts import HangTimeoutPolicy
from ..policy.world_size import SizeRule
from ..protocol import StepBegan, StepDone

T0 = 1_000_000.0
RANKS = (0, 1)
MONITOR_INTERVAL_S: float = default_of("monitor_interval_s")
SUPERVISED_ATTEMPTS = 32  # attempts each run through a supervisor; beyond, the recorded failure repeats
MAX_BUDGET_PROBE = 100_000  # the largest restart period looked for (the simulator's max_restarts bound)
MAX_TICKS = 1_000  # bound on one supervised attempt's loop
BISECT_ROUNDS = 80


def _default(name: str):
    return default_of(name)


@dataclass(frozen=True)
class ProbeConfig:
    """The part of the run configuration the supervisor and its monitors read (the agent's defaults)."""

    hang_policy: HangTimeoutPolicy = HangTimeoutPolicy()
    monitor_interval_s: float = MONITOR_INTERVAL_S
    stop_grace_s: float = _default("stop_grace_s")
    emergency_deadline_s: float = _default("emergency_deadline_s")
    startup_timeout_s: float = _default("startup_timeout_s")
    cpu_stall_s: float = _default("cpu_stall_s")
    min_nodes: int = 1
    max_nodes: int = 1
    size_rule: SizeRule = SizeRule()
    diagnose_interval_s: float = 0.0  # no live diagnosis: the agent raises its own incidents


@dataclass
class _Group:
    """A worker group that only records: exit codes are set by the probe, ``stop`` ends the rest."""

    codes: dict[int, int | None]
    exit_times: dict[int, float] = field(default_factory=dict)
    stops: list[float] = field(default_factory=list)

    def poll(self) -> dict[int, int | None]:
        return dict(self.codes)

    def pid(self, rank: int) -> int:
        return -1

    def stop(self, grace: float) -> dict[int, int | None]:
        self.stops.append(grace)
        self.codes = {r: (-signal.SIGTERM if c is None else c) for r, c in self.codes.items()}
        return dict(self.codes)


@dataclass
class _Pipe:
    queue: list = field(default_factory=list)

    def drain(self) -> list:
        out, self.queue = self.queue, []
        return out


class _Block:
    def read_beat(self, slot: int) -> None:
        return None

    def request_stop(self, after: int) -> None:
        raise RuntimeError("probe: the agent was never signalled, yet a stop was requested")


class _Rig:
    """One attempt: a real supervisor over two fake ranks on a manual clock, its events recorded."""

    def __init__(self, cfg: ProbeConfig, attempt: int, clock: ManualClock, script=None) -> None:
        self.clock = clock
        self.group = _Group({r: None for r in RANKS})
        self.pipe = _Pipe()
        self.events: list = []
        self.ticks = 0
        self.script = script

        def chaos(tracker) -> None:  # called once per supervisor tick: the workers' side of the tick
            self.ticks += 1
            if self.ticks > MAX_TICKS:
                raise RuntimeError(f"probe: no decision after {MAX_TICKS} supervisor ticks")
            if self.script is not None:
                self.script(self)

        hooks = Hooks(
            ctx=lambda: {"run_id": "sim", "node": "sim0", "attempt": attempt},
            emit=lambda ev, show=True: self.events.append(ev),
            record=lambda evs: self.events.extend(evs),
            chaos=chaos,
            read_proc=lambda pid: None,
        )
        specs = [SimpleNamespace(local_rank=r, global_rank=r, log_path=None) for r in RANKS]
        self.sup = Supervisor(
            cfg=cfg,
            hooks=hooks,
            group=self.group,
            receiver=self.pipe,
            block=_Block(),
            specs=specs,
            clock=clock,
            attempt=attempt,
            node="sim0",
        )

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

    lo, hi = last, last + max(policy.cap_s, policy.startup_s, cfg.startup_timeout_s) + 2 * monitor_interval_s
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
    clock = ManualClock(T0)

    def workers(rig: _Rig) -> None:
        if rig.ticks == 1:
            rig.step(0, cfg.monitor_interval_s / 2)
        elif rig.ticks == 3:
            rig.group.codes[0] = -signal.SIGKILL
            rig.group.exit_times[0] = clock.now()

    rig = _Rig(cfg, attempt=attempt, clock=clock, script=workers)
    out = rig.sup.run()
    if out.failure is None:
        raise RuntimeError(f"probe: a killed rank ended the attempt with {out.status}, not a failure")
    return out.failure


@dataclass(frozen=True)
class RestartProbe:
    period: int | None  # the failure after which the agent stops the job; None: it never does
    supervised: int  # how many of the failures ran through a supervisor
    decision: RestartDecision | None  # the stopping decision, with its reason


@lru_cache(maxsize=256)
def restart_stop(budget: RestartBudget | None, supervised: int = SUPERVISED_ATTEMPTS) -> RestartProbe:
    """Successive infrastructure failures through the supervisor, and the agent's restart decision
    after each, until it stops the job."""
    if budget is None:  # no budget in the agent: a cluster manager restarts, the agent never stops
        return RestartProbe(None, 0, None)
    history: list[Failure] = []
    for attempt in range(supervised):
        history.append(supervised_crash(attempt))
        d = restart_decide(history, budget)
        if d.action == "stop":
            return RestartProbe(attempt + 1, attempt + 1, d)
    last = history[-1]

    def at(k: int) -> RestartDecision:
        history.extend(dataclasses.replace(last, attempt=a) for a in range(len(history), k))
        return restart_decide(history[:k], budget)

    lo = hi = supervised
    while at(hi).action != "stop":
        if hi >= MAX_BUDGET_PROBE:
            return RestartProbe(None, supervised, None)
        lo, hi = hi, min(2 * hi, MAX_BUDGET_PROBE)
    while hi - lo > 1:  # at(lo) restarts, at(hi) stops
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if at(mid).action == "stop" else (mid, hi)
    return RestartProbe(hi, supervised, at(hi))
