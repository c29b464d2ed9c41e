"""XID lines from the kernel log (``dmesg``, ``/dev/kmsg``, journal or a recorded file).

Formats (see docs/health.md): ``NVRM: Xid (PCI:0000:2b:00): 79, <text>``, the older form without
``PCI:``, and the "fallen off the bus" lines that carry no ``Xid (`` prefix at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import TelemetryError
from ..inputs import read_text_tail
from .deadline import CallTimedOut, run_command

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bdf>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\): "
    r"(?P<xid>[^,]*),\s*(?P<text>.*)$"
)
_STAMP = re.compile(r"^\s*\[\s*(\d+(?:\.\d+)?)\]")
_OFF_BUS = re.compile(
    r"NVRM: (?:The NVIDIA )?GPU (?P<bdf>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?:\.\d)?.*fallen off the bus"
)


def normalise_bdf(bdf: str) -> str:
    """``00000000:18:00.0`` and ``0000:18:00`` both become ``0000:18:00``."""
    parts = bdf.lower().split(":")
    if len(parts) < 3:
        return bdf.lower()
    domain = parts[0][-4:].rjust(4, "0")
    return f"{domain}:{parts[1]}:{parts[2].split('.')[0]}"


@dataclass(frozen=True)
class XidLine:
    bdf: str
    xid: int
    text: str
    line: str
    t_boot: float | None = None  # seconds since boot, from dmesg's "[  812.345678]" prefix


@dataclass(frozen=True)
class KernelLogObservation:
    source: str
    available: bool
    xids: tuple[XidLine, ...] = ()
    lines_read: int = 0
    problems: tuple[str, ...] = ()  # XID-looking lines we could not parse, unreadable log


def _stamp(line: str) -> float | None:
    m = _STAMP.match(line)
    return float(m.group(1)) if m else None


def read_uptime(path: Path = Path("/proc/uptime")) -> float | None:
    try:
        return float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def parse_kernel_log(text: str, source: str = "kernel log") -> KernelLogObservation:
    xids: list[XidLine] = []
    problems: list[str] = []
    bad = 0
    lines = text.splitlines()
    for raw in lines:
        line = raw.strip()
        if "NVRM" not in line:
            continue
        m = _XID.search(line)
        if m:
            try:
                xid = int(m.group("xid").strip())
            except ValueError:
                bad += 1
                if bad <= 3:
                    problems.append(f"unparseable Xid line: {line[:160]!r}")
                continue
            xids.append(XidLine(normalise_bdf(m.group("bdf")), xid, m.group("text"), line, _stamp(line)))
            continue
        m = _OFF_BUS.search(line)
        if m:
            xids.append(
                XidLine(normalise_bdf(m.group("bdf")), 79, "GPU has fallen off the bus", line, _stamp(line))
            )
            continue
        if "Xid" in line:
            bad += 1
            if bad <= 3:
                problems.append(f"unparseable Xid line: {line[:160]!r}")
    if bad > 3:
        problems.append(f"... {bad - 3} more unparseable Xid lines")
    if "\ufffd" in text:
        problems.append(f"{source} contains bytes that are not valid UTF-8")
    return KernelLogObservation(
        source=source, available=True, xids=tuple(xids), lines_read=len(lines), problems=tuple(problems)
    )


MAX_KERNEL_LOG_BYTES = 16 << 20  # the newest 16 MiB: a ring buffer holds far less


def read_kernel_log_file(path: Path, max_bytes: int = MAX_KERNEL_LOG_BYTES) -> KernelLogObservation:
    """The newest ``max_bytes`` of a kernel log file; a FIFO, device or directory is a problem, not a hang."""
    try:
        text, _cut = read_text_tail(path, max_bytes, "kernel log", error=TelemetryError)
    except TelemetryError as exc:
        return KernelLogObservation(source=str(path), available=False, problems=(exc.message,))
    return parse_kernel_log(text, source=str(path))


def collect_kernel_log(timeout_s: float = 5.0) -> KernelLogObservation:
    """``dmesg`` under a deadline. Not being allowed to read it is reported, not raised."""
    try:
        proc = run_command(["dmesg"], timeout_s)  # keep the [seconds since boot] stamps
    except CallTimedOut:
        return KernelLogObservation(source="dmesg", available=False, problems=("dmesg timed out",))
    except OSError as exc:
        return KernelLogObservation(source="dmesg", available=False, problems=(f"dmesg: {exc}",))
    if proc.returncode != 0:
        return KernelLogObservation(
            source="dmesg",
            available=False,
            problems=(f"dmesg exit {proc.returncode}: {proc.stderr.strip()[:200]}",),
        )
    return parse_kernel_log(proc.stdout, source="dmesg")
