"""The error record: what a failed rank leaves for its agent, in one of three forms.

- the SDK's record, written by :func:`write_error` from the worker's excepthook and read by
  :func:`read_error`;
- torch elastic's ``@record`` error file (``TORCHELASTIC_ERROR_FILE``): :func:`read_elastic_error`;
- the last Python traceback printed in the rank's log: :func:`error_from_log`.

The file format is part of the agent-worker contract and lives here only; the diagnosis
(diagnose/root_cause.py) classifies records, it does not parse them.
"""

from __future__ import annotations

import json
import os
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

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


def write_error(
    path: Path,
    etype: type[BaseException],
    value: BaseException,
    tb: TracebackType | None,
    *,
    step: int | None,
    rank: int,
    ts: float | None = None,
) -> None:
    """The SDK's record of an exception that ends a worker (the excepthook calls it); ``ts``: when
    (now, unless given)."""
    record = {
        "type": f"{etype.__module__}.{etype.__qualname__}",
        "message": str(value)[:2000],
        "traceback": "".join(traceback.format_exception(etype, value, tb))[-8000:],
        "step": step,
        "rank": rank,
        "ts": time.time() if ts is None else ts,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:  # private, as every file of the run: a traceback names the code
        fh.write(json.dumps(record))
