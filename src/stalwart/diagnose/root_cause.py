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

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .incident import Component, FaultClass

# Exceptions that say "a peer or the network went away": the fault is elsewhere. Whole words and
# phrases only: a user's "restore_from" or "/data/datastore" must not read as a store failure.
COMM_TYPES = re.compile(r"\b(DistBackendError|DistNetworkError|DistStoreError|DistError)$")
COMM_TEXT = re.compile(
    r"(\bgloo\b|\bnccl\b|\bc10d\b|connection (reset|closed|refused)|broken pipe|\btimed out\b|"
    r"\bProcessGroup\w*|read error|transport/tcp|\brendezvous (closed|timed out|failed)\b)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ErrorRecord:
    type: str
    message: str
    step: int
    ts: float
    traceback: str = ""
    place: str = ""  # 'file:line' of the innermost frame, when known

    @property
    def signature(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        sig = f"{self.type.rsplit('.', 1)[-1]}: {first[:200]}"
        return f"{sig} at {self.place}" if self.place else sig

    @property
    def is_comm_error(self) -> bool:
        return bool(COMM_TYPES.search(self.type) or COMM_TEXT.search(self.message[:500]))


_PREFIX = re.compile(r"^\[[\w.-]+\]:\s?")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_LAST = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|\w*))(?::\s?(.*))?$")


def read_error(path: Path) -> ErrorRecord | None:
    """The SDK's error record (JSON written by the session's excepthook)."""
    try:
        data = json.loads(path.read_text())
        step = data.get("step")
        tb = str(data.get("traceback", ""))
        return ErrorRecord(
            type=str(data["type"]),
            message=str(data.get("message", "")),
            step=int(step) if step is not None else -1,
            ts=float(data.get("ts", 0.0)),
            traceback=tb,
            place=_place(tb),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_elastic_error(path: Path) -> ErrorRecord | None:
    """torch elastic's ``@record`` error file (TORCHELASTIC_ERROR_FILE)."""
    try:
        data = json.loads(path.read_text())["message"]
        text, extra = str(data["message"]), data.get("extraInfo", {})
        etype, _, message = text.partition(": ")
        tb = str(extra.get("py_callstack", ""))
        return ErrorRecord(
            type=etype,
            message=message,
            step=-1,
            ts=float(extra.get("timestamp", 0) or 0),
            traceback=tb,
            place=_place(tb),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def error_from_log(text: str) -> ErrorRecord | None:
    """The last Python traceback printed in a worker's log, if the log ends with one."""
    # torch prefixes a distributed worker's traceback lines with "[rankN]:"; torchrun's --tee with "[role0]:"
    lines = [_PREFIX.sub("", line, count=1) for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    block = lines[starts[-1] :]
    # the exception line: the first line after the frames that is not indented
    last = next((line for line in block[1:] if line and not line.startswith((" ", "\t"))), "")
    m = _LAST.match(last.strip())
    if m is None:
        return None
    tb = "\n".join(block[: block.index(last) + 1])
    return ErrorRecord(
        type=m.group(1), message=m.group(2) or "", step=-1, ts=0.0, traceback=tb, place=_place(tb)
    )


def _place(tb: str) -> str:
    frames = [m for m in (_FRAME.match(line) for line in tb.splitlines()) if m]
    if not frames:
        return ""
    path, line = frames[-1].groups()
    return f"{Path(path).name}:{line}"


def classify(code: int, error: ErrorRecord | None) -> str:
    """``exception`` (user code), ``peer_lost`` (comm error: the cause is elsewhere) or ``crash``."""
    if error is not None and code > 0:
        return "peer_lost" if error.is_comm_error else "exception"
    return "crash"


# (pattern over "failure evidence error_type error_message", component class), first match wins.
COMPONENT_RULES: tuple[tuple[str, str], ...] = (
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
    "user": (FaultClass.USER, Component.USER_CODE),
}


def incident_class(component: str) -> tuple[FaultClass, Component]:
    """The incident model's (class, component) for a :func:`component_class` result."""
    return _INCIDENT_CLASS.get(component, (FaultClass.UNKNOWN, Component.UNKNOWN))
