"""Node health: passive and active checks, findings -> verdicts, node lifecycle, drain backends.

Collectors observe (NVML, recorded fixtures, kernel log, InfiniBand sysfs, mounts), checks turn
observations into :class:`Finding` objects, the rule table turns findings into a :class:`Verdict`,
and the lifecycle turns a verdict into a node state change and an action that a backend carries out.

The agent calls :func:`run_gate` before the first start and before each restart.
"""

from .findings import Finding, Severity
from .gate import GateConfig, GateResult, run_gate
from .lifecycle import NodeRecord, NodeState, Transition, transition
from .rules import RuleTable, Verdict, load_rules

__all__ = [
    "Finding",
    "GateConfig",
    "GateResult",
    "NodeRecord",
    "NodeState",
    "RuleTable",
    "Severity",
    "Transition",
    "Verdict",
    "load_rules",
    "run_gate",
    "transition",
]
