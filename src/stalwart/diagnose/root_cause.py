"""Crash root cause and component classes: the one copy the agent (launch/) and the accounting
(account/) call.

- :func:`classify`: a failed worker's exit is ``exception`` (user code), ``peer_lost`` (a comm error:
  the cause is elsewhere) or ``crash`` (killed by a signal, or no error record);
- :func:`component_class`: the component class of a failure from its evidence text (coarsened from
  the Llama 3 interruption table, arXiv 2407.21783, Table 5), then from the failure kind;
- :func:`incident_class`: the same class as the incident model's (FaultClass, Component).
- :func:`read_error`, :func:`read_elastic_error`, :func:`error_from_log`: a failed rank's error from
  the SDK's record, torch elastic's ``@record`` file, or the last traceback in its log.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..protocol.error_record import ErrorRecord, error_from_log, read_elastic_error, read_error
from .incident import Component, FaultClass

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


# (pattern over "failure evidence error_type error_message", component class), first match wins.
COMPONENT_RULES: tuple[tuple[str, str], ...] = (
    # the words of diagnose/kill_rules.yaml: a death by a signal classified by its evidence
    (r"killed by the chaos plan", "injected"),
    (r"kernel oom killer", "host_memory"),
    (r"killed from outside the job|killed by sig\w+ from outside", "infrastructure"),
    (r"crashed in native code", "native_crash"),
    (r"\bxid\s*(48|63|64|92|94|95)\b|\becc\b|hbm|row.?remap|dbe\b", "gpu_memory"),
    (r"\bxid\s*(74)\b|nvlink", "nvlink"),
    (r"\bxid\s*(79)\b|fallen off the bus|\bxid\b|gpu (lost|error)|cuda error", "gpu"),
    (r"nccl.*(watchdog|timeout)|collective.*timed? ?out", "nccl_timeout"),
    (r"infiniband|\bib\b|mlx|\bnic\b|link (down|flap)|network", "network"),
    (r"\bssd\b|nvme|filesystem|i/o error|disk", "storage"),
    (r"power|psu\b|thermal|overheat", "power_thermal"),
    (r"out of memory|\boom\b|segmentation fault|sigsegv|traceback|exception", "software"),
)
FAILURE_DEFAULTS: Mapping[str, str] = {
    "crash": "software",
    "hang": "hang",
    "agent_lost": "host",
    "peer_lost": "unknown",
    "preempted": "planned",
    "user_error": "user",
}


def component_class(failure: str, evidence: str = "", error_type: str = "", error_message: str = "") -> str:
    """Component class of a failure, from the evidence text first, then the failure kind."""
    text = f"{evidence} {error_type} {error_message}".lower()
    for pattern, cls in COMPONENT_RULES:
        if re.search(pattern, text):
            return cls
    return FAILURE_DEFAULTS.get(failure, "unknown")


_INCIDENT_CLASS: Mapping[str, tuple[FaultClass, Component]] = {
    "gpu_memory": (FaultClass.HARDWARE, Component.GPU_MEMORY),
    "nvlink": (FaultClass.HARDWARE, Component.NVLINK),
    "gpu": (FaultClass.HARDWARE, Component.GPU),
    "nccl_timeout": (FaultClass.UNKNOWN, Component.COMMUNICATION),
    "network": (FaultClass.HARDWARE, Component.IB_LINK),
    "storage": (FaultClass.SYSTEM, Component.MOUNT),
    "power_thermal": (FaultClass.HARDWARE, Component.POWER),
    "software": (FaultClass.USER, Component.USER_CODE),
    "host_memory": (FaultClass.USER, Component.HOST_MEMORY),
    "user": (FaultClass.USER, Component.USER_CODE),
}


def incident_class(component: str) -> tuple[FaultClass, Component]:
    """The incident model's (class, component) for a :func:`component_class` result."""
    return _INCIDENT_CLASS.get(component, (FaultClass.UNKNOWN, Component.UNKNOWN))
