"""The agent's own policies, asked by the simulator (an adapter, no re-implementation).

The vectorised engine cannot call a Python policy once per trial and failure (a year at 100,000 GPUs
is 20 million failures per 1,000 trials), so it asks the agent once per *distinct* situation (cached)
and vectorises the answers:

* restart decision: successive infrastructure failures (a rank that had progressed is killed) run
  through the agent's supervisor and monitors on a manual clock (``sim/agent_probe.py``), and after
  each the agent's own call, ``policy.restart_policy.decide`` over the job's failure history, until it
  says stop; that failure's number is the period after which the job exits with ``infra_exhausted``
  and goes back through the scheduler (the simulator then charges a requeue and the budget starts
  again, as for a requeued job);
* restart back-off: after ``s`` failures in a row whose attempts made no progress, the agent waits
  before its next attempt; ``policy.restart_policy.decide`` is asked over such a history, once per
  ``s`` until the answer stops growing (it is capped);
* hang detection latency: the supervisor and its monitors watch ranks completing steps of the
  simulated step time (which calibrates ``policy.timeouts.hang_timeout``), then one rank falls silent;
  the time from its last progress to the monitors' ``hang`` decision (the timeout less one monitor
  tick: the hang monitor declares up to a tick early, never late) is the detection latency of every
  failure class of kind ``hang``;
* world size and hot spares (``policy.world_size.plan_world`` / ``replace_failed``, asked directly:
  the supervisor has no path for them, the agent re-plans its world at the rendezvous): for k nodes
  in repair, whether the job can run and at what fraction of its world size (a spare steps in, the job
  re-plans at a smaller valid size when elastic, or it cannot run and waits for a repaired node).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import ConfigError
from ..policy.restart_policy import Failure, RestartBudget, decide
from ..policy.timeouts import HangTimeoutPolicy
from ..policy.vocabulary import FailureKind
from ..policy.world_size import SizeRule, WorldPlan, plan_world, replace_failed
from .agent_probe import MONITOR_INTERVAL_S, hang_latency, restart_stop

# sim/agent_probe.py (the supervisor and its monitors, the launch configuration's defaults) is imported
# on first use: a simulation without a restart budget or a step time never pays for it


def restart_period(budget: RestartBudget | None) -> int | None:
    """The number of consecutive infrastructure failures after which the agent stops the job (the
    last of them stops it); ``None`` when it never stops (no budget: a cluster manager restarts)."""
    if budget is None:
        return None

    return restart_stop(budget).period


def restart_backoff(budget: RestartBudget | None, limit: int = 64) -> np.ndarray | None:
    """The agent's wait before its next attempt after ``s`` failures in a row without progress, at index
    ``s`` (0, 1, 2, ... up to where the policy's answer stops growing; longer streaks wait as long as
    the last entry). ``None`` when the agent never waits (no budget, or a zero back-off)."""
    if budget is None:
        return None
    waits = [0.0]
    for s in range(1, limit + 1):
        history = [
            Failure(kind=FailureKind.CRASH, attempt=i, step=-1, rank=0, evidence="probe", progressed=False)
            for i in range(s)
        ]
        # a budget wide enough that the policy restarts: when it stops is the restart period's business
        d = decide(history, replace(budget, max_restarts=max(budget.max_restarts, s)))
        waits.append(d.backoff_s)
        if s > 2 and waits[-1] == waits[-2]:  # capped: every longer streak waits as long
            break
    return np.array(waits) if any(waits) else None


def hang_detect_s(step_s: float, policy: HangTimeoutPolicy, monitor_interval_s: float | None = None) -> float:
    """How long after a rank's last progress the agent's monitors decide it hung, for steps of
    ``step_s`` seconds (the calibrated hang timeout less at most one monitor tick; the tick is the
    agent's default unless given)."""

    tick = MONITOR_INTERVAL_S if monitor_interval_s is None else monitor_interval_s
    if not policy.floor_s > tick:  # the agent refuses this order of timeouts (policy/timeouts.py)
        raise ConfigError(
            f"hang floor {policy.floor_s:g}s is not above the agent's monitor interval {tick:g}s, "
            "so the agent would refuse it",
            f"set hang_floor_s above {tick:g}",
        )
    return hang_latency(float(step_s), policy, tick).latency_s


@dataclass
class WorldSizer:
    """Answers "k nodes are in repair: can the job run, and at what share of its size?" from the shipped
    world-size policy, once per distinct k (cached)."""

    nodes: int
    spares: int
    gpus_per_node: int
    min_nodes: int
    rule: SizeRule
    _cache: dict[int, tuple[bool, float]] = field(default_factory=dict)
    _plan: WorldPlan | None = None
    _names: list[str] = field(default_factory=list)
    _table: tuple[np.ndarray, np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.zeros(0, dtype=bool), np.zeros(0), np.zeros(0, dtype=bool))
    )

    def __post_init__(self) -> None:
        self._names = [f"n{i}" for i in range(self.nodes + self.spares)]
        self._plan = plan_world(self._names, self.gpus_per_node, self.min_nodes, self.nodes, self.rule)

    @property
    def initial_share(self) -> float:
        assert self._plan is not None
        return len(self._plan.active) / self.nodes

    def table(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(runnable, share) as arrays indexed by the count of nodes in repair, filled at least for every
        count in ``counts`` (the policy is asked once per count; the tables are kept between calls)."""
        run, share, known = self._table
        top = int(counts.max()) if len(counts) else 0
        if len(run) <= top:
            grow = top + 1 - len(run)
            run = np.concatenate([run, np.ones(grow, dtype=bool)])
            share = np.concatenate([share, np.ones(grow)])
            known = np.concatenate([known, np.zeros(grow, dtype=bool)])
        present = np.bincount(counts, minlength=len(run)) > 0 if len(counts) else np.zeros(len(run), bool)
        missing = np.flatnonzero(present & ~known)
        if len(missing):
            run, share, known = run.copy(), share.copy(), known.copy()
            for k in missing:
                run[k], share[k] = self.share(int(k))
            known[missing] = True
        self._table = (run, share, known)  # one assignment: a thread sees the old tables or the new ones
        return run, share

    def share(self, out: int) -> tuple[bool, float]:
        """(runnable, active nodes / configured nodes) with ``out`` nodes in repair."""
        if out <= 0:
            return True, self.initial_share
        hit = self._cache.get(out)
        if hit is None:
            assert self._plan is not None
            # failures strike the nodes that run the job: the active slots first, then the spares that
            # stepped into them, then (the job re-planned smaller) its remaining active nodes, until
            # ``out`` nodes are in repair; idle spares are taken only when no node is active
            after, left = self._plan, out
            while left > 0:
                pool = after.active or after.spares
                if not pool:  # every node is in repair
                    break
                down = list(pool[:left])
                after = replace_failed(after, down, self.min_nodes, self.nodes, self.rule)
                left -= len(down)
            hit = (after.runnable, len(after.active) / self.nodes)
            self._cache[out] = hit
        return hit
