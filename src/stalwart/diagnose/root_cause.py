"""Crash root cause and component classes: the one copy the agent (launch/) and the accounting
(account/) call.

- :func:`classify`: a failed worker's exit is ``exception`` (user code), ``peer_lost`` (a comm error:
  the cause is elsewhere) or ``crash`` (killed by a signal, or no error record);
- :func:`component_class`: what broke in a failure (a :class:`~stalwart.policy.vocabulary.Component`),
  from its evidence text (the causes of the Llama 3 interruption table, arXiv 2407.21783, Table 5),
  then from the failure kind;
- :func:`incident_class`: the same component with who owns its fix (FaultClass, Component).
- :func:`read_error`, :func:`read_elastic_error`, :func:`error_from_log`: a failed rank's error from
  the SDK's record, torch elastic's ``@record`` file, or the last traceback in its log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..policy.vocabulary import Component, FailureKind, FaultClass, fault_class_of
from ..protocol.error_record import ErrorRecord, error_from_log, read_elastic_error, read_error

__all__ = [
    "ErrorRecord",
    "classify",
    "component_class",
    "error_from_log",
    "incident_class",
    "read_elastic_error",
    "read_error",
]


def classify(code: int, error: ErrorRecord | None) -> str:
    """``exception`` (user code), ``peer_lost`` (comm error: the cause is elsewhere) or ``crash``."""
    if error is not None and code > 0:
        return "peer_lost" if error.is_comm_error else "exception"
    return "crash"


# (pattern over "failure evidence error_type error_message", component), first match wins. The first
# four are the words of diagnose/kill_rules.yaml: a death by a signal is told from its evidence to
# the same component its kill rule names
COMPONENT_RULES: tuple[tuple[str, Component], ...] = (
    (r"killed by the chaos plan", Component.INJECTED),
    (r"kernel oom killer", Component.HOST_MEMORY),
    (r"killed from outside the job|killed by sig\w+ from outside", Component.EXTERNAL),
    (r"crashed in native code", Component.NATIVE_CODE),
    (r"\bxid\s*(48|63|64|92|94|95)\b|\becc\b|hbm|row.?remap|dbe\b", Component.GPU_MEMORY),
    (r"\bxid\s*(74)\b|nvlink", Component.NVLINK),
    (r"\bxid\s*(79)\b|fallen off the bus|\bxid\b|gpu (lost|error)|cuda error", Component.GPU),
    (r"nccl.*(watchdog|timeout)|collective.*timed? ?out", Component.COMMUNICATION),
    (r"infiniband|\bib\b|mlx|link (down|flap)", Component.IB_LINK),
    (r"\bnic\b|network", Component.NIC),
    (r"\bssd\b|nvme|filesystem|i/o error|disk", Component.STORAGE),
    (r"thermal|overheat", Component.COOLING),
    (r"power|psu\b", Component.POWER),
    (r"out of memory|\boom\b|segmentation fault|sigsegv|traceback|exception", Component.USER_CODE),
)
# with no telling evidence: what the failure kind says
FAILURE_DEFAULTS: Mapping[FailureKind, Component] = {
    FailureKind.CRASH: Component.USER_CODE,
    FailureKind.EXCEPTION: Component.USER_CODE,
    FailureKind.HANG: Component.COMMUNICATION,
    FailureKind.AGENT_LOST: Component.HOST,
    FailureKind.PEER_LOST: Component.UNKNOWN,
}


def component_class(
    failure: str, evidence: str = "", error_type: str = "", error_message: str = ""
) -> Component:
    """What broke in a failure, from the evidence text first, then the failure kind."""
    text = f"{evidence} {error_type} {error_message}".lower()
    for pattern, component in COMPONENT_RULES:
        if re.search(pattern, text):
            return component
    return next((c for k, c in FAILURE_DEFAULTS.items() if k == failure), Component.UNKNOWN)


def incident_class(component: Component) -> tuple[FaultClass, Component]:
    """The incident model's (class, component) for a :func:`component_class` result: who owns the
    fix of that component."""
    return fault_class_of(component), component
