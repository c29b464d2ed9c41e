"""The agent's health gate: check this node before the first start and before every restart.

Glue between the agent and ``stalwart.health``: run the checks (collectors), let the rules and
the lifecycle decide, and have the node controller record the result and drain/resume through
the scheduler backend. A node that ends up quarantined takes itself out of the job; the other
agents continue without it at the largest valid world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..health.backends import make_backend
from ..health.gate import GateConfig, run_gate
from ..health.lifecycle import LifecyclePolicy, NodeState
from ..health.node_controller import apply_verdict
from ..health.node_store import HealthStore


@dataclass(frozen=True)
class GateOutcome:
    passed: bool
    reason: str
    duration_s: float
    state: str
    level: str = "passive"  # passive | active: what was checked
    status: str = "pass"  # pass | warn | fail: the checks' verdict
    action: str = "none"  # the rule table's action for that verdict


def check_node(
    *,
    node: str,
    now: float,
    state_dir: Path,
    fixture: Path | None,
    active: bool,
    backend: str,
    kernel_log: str = "dmesg",
) -> GateOutcome:

    store = HealthStore(state_dir)
    before = store.record(node)
    handled = before.since if before.state in (NodeState.QUARANTINED, NodeState.PROBATION) else None
    cfg = GateConfig(
        fixture=fixture,
        active=active,
        allreduce=False,
        kernel_log=kernel_log,
        disk_dir=state_dir if active else None,
    )
    res = run_gate(cfg, now, node=node, handled_before=handled)
    applied = apply_verdict(
        node,
        res.verdict,
        level="active" if active else "passive",
        backend=make_backend(backend),
        store=store,
        policy=LifecyclePolicy(),
        now=now,
        duration_s=res.duration_s,
    )
    state = applied.transition.record.state
    passed = res.passed and state != NodeState.QUARANTINED
    reason = res.reason if state != NodeState.QUARANTINED else f"{res.reason}; {applied.transition.reason}"
    level = "active" if active else "passive"
    verdict = res.verdict
    return GateOutcome(
        passed, reason, res.duration_s, state.value, level, verdict.status.value, verdict.action
    )
