"""The agent's own policies, asked by the simulator (an adapter, no re-implementation).

The vectorised engine cannot call a Python policy once per trial and failure (a year at 100,000 GPUs
is 20 million failures per 1,000 trials), so it asks each shipped policy once per *distinct* situation
and vectorises the answers:

* restart decision (``launch.restart_policy.decide``): fed a history of k infrastructure failures for
  k = 1, 2, ... until it says stop; the first k that stops is the period after which the job exits
  with ``infra_exhausted`` and goes back through the scheduler (the simulator then charges a requeue
  and the budget starts again, as for a requeued job);
* hang timeout (``launch.timeouts.hang_timeout``): calibrated on the simulated step time; it is the
  detection latency of every failure class of kind ``hang``;
* world size and hot spares (``launch.world_size.plan_world`` / ``replace_failed``): for k nodes in
  repair, whether the job can run and at what fraction of its world size (a spare steps in, the job
  re-plans at a smaller valid size when elastic, or it cannot run and waits for a repaired node).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..launch.restart_policy import Failure, RestartBudget, decide
from ..launch.timeouts import HangTimeoutPolicy, hang_timeout
from ..launch.world_size import SizeRule, WorldPlan, plan_world, replace_failed

MAX_BUDGET_PROBE = 100_000


def restart_period(budget: RestartBudget | None) -> int | None:
    """The number of consecutive infrastructure failures after which the shipped policy stops the job
    (the last of them stops it); ``None`` when it never stops (no budget: a cluster manager restarts)."""
    if budget is None:
        return None
    history: list[Failure] = []
    for k in range(1, MAX_BUDGET_PROBE + 1):
        history.append(Failure(kind="crash", attempt=k - 1, step=k, rank=0, evidence="sim", progressed=True))
        if decide(history, budget).action == "stop":
            return k
    return None


def hang_detect_s(step_s: float, policy: HangTimeoutPolicy) -> float:
    """The hang timeout the agent would use once calibrated on steps of ``step_s`` seconds."""
    return hang_timeout([step_s] * max(policy.min_samples, 1), policy).seconds


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

    def __post_init__(self) -> None:
        self._names = [f"n{i}" for i in range(self.nodes + self.spares)]
        self._plan = plan_world(self._names, self.gpus_per_node, self.min_nodes, self.nodes, self.rule)

    @property
    def initial_share(self) -> float:
        assert self._plan is not None
        return len(self._plan.active) / self.nodes

    def share(self, out: int) -> tuple[bool, float]:
        """(runnable, active nodes / configured nodes) with ``out`` nodes in repair."""
        if out <= 0:
            return True, self.initial_share
        hit = self._cache.get(out)
        if hit is None:
            assert self._plan is not None
            # the nodes in repair are the ones that failed first: active slots, then spares stepped in
            failed = self._plan.active[: min(out, len(self._plan.active))]
            after = replace_failed(self._plan, failed, self.min_nodes, self.nodes, self.rule)
            if out > len(self._plan.active):  # more out than active: the rest come off the spares
                extra = list(after.spares[: out - len(failed)])
                after = replace_failed(after, extra, self.min_nodes, self.nodes, self.rule)
            hit = (after.runnable, len(after.active) / self.nodes)
            self._cache[out] = hit
        return hit
