"""Classifying a failed worker group: which rank failed first, and was it user code or infrastructure."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# Exceptions that say "a peer or the network went away": the fault is elsewhere. Whole words and
# phrases only: a user's "restore_from" or "/data/datastore" must not read as a store failure.
_COMM_TYPES = re.compile(r"\b(DistBackendError|DistNetworkError|DistStoreError|DistError)$")
_COMM_TEXT = re.compile(
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

    @property
    def signature(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type.rsplit('.', 1)[-1]}: {first[:200]}"

    @property
    def is_comm_error(self) -> bool:
        return bool(_COMM_TYPES.search(self.type) or _COMM_TEXT.search(self.message[:500]))


def read_error(path: Path) -> ErrorRecord | None:
    try:
        data = json.loads(path.read_text())
        step = data.get("step")
        return ErrorRecord(
            type=str(data["type"]),
            message=str(data.get("message", "")),
            step=int(step) if step is not None else -1,
            ts=float(data.get("ts", 0.0)),
            traceback=str(data.get("traceback", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def classify(code: int, error: ErrorRecord | None) -> str:
    """``exception`` (user code), ``peer_lost`` (comm error: the cause is elsewhere) or ``crash``."""
    if error is not None and code > 0:
        return "peer_lost" if error.is_comm_error else "exception"
    return "crash"
