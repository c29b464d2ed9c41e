"""InfiniBand / RoCE port state, rate and error counters from sysfs (root injectable).

Layout: ``<root>/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer,counters/*}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TelemetryError
from ..inputs import read_text_file

ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
# Classic PortCounters saturate at all-ones (IBTA): a pegged value means "unknown, at least this high".
SATURATION = {"symbol_error": 0xFFFF, "link_error_recovery": 0xFF, "link_downed": 0xFF}


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str = ""  # ACTIVE, DOWN, INIT, ...
    phys_state: str = ""  # LinkUp, Polling, Disabled, ...
    rate_gbps: float | None = None
    link_layer: str = ""
    counters: dict[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


@dataclass(frozen=True)
class IbObservation:
    root: str
    ports: tuple[IbPort, ...] = ()


def _read(p: Path) -> str | None:
    """One sysfs value; a missing file, a FIFO or a device (a hang with a plain read) is None."""
    try:
        return read_text_file(p, 64 << 10, "sysfs value", error=TelemetryError, replace_errors=True).strip()
    except TelemetryError:
        return None


def _state(text: str | None) -> str:
    # "4: ACTIVE" -> "ACTIVE"
    if not text:
        return ""
    return text.split(":", 1)[-1].strip()


def collect_infiniband(sys_root: Path = Path("/sys")) -> IbObservation:
    base = sys_root / "class" / "infiniband"
    ports: list[IbPort] = []
    if not base.is_dir():
        return IbObservation(root=str(sys_root))
    for dev in sorted(base.iterdir()):
        for pdir in sorted((dev / "ports").glob("*")):
            problems: list[str] = []
            try:
                port = int(pdir.name)
            except ValueError:
                continue
            rate_text = _read(pdir / "rate")
            rate = None
            if rate_text:
                m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", rate_text)
                if m:
                    rate = float(m.group(1))
                else:
                    problems.append(f"unparseable rate {rate_text!r}")
            counters: dict[str, int] = {}
            for name in ERROR_COUNTERS:
                raw = _read(pdir / "counters" / name)
                if raw is None:
                    continue
                try:
                    counters[name] = int(raw)
                except ValueError:
                    problems.append(f"unparseable counter {name}={raw[:40]!r}")
            ports.append(
                IbPort(
                    device=dev.name,
                    port=port,
                    state=_state(_read(pdir / "state")),
                    phys_state=_state(_read(pdir / "phys_state")),
                    rate_gbps=rate,
                    link_layer=_read(pdir / "link_layer") or "",
                    counters=counters,
                    problems=tuple(problems),
                )
            )
    return IbObservation(root=str(sys_root), ports=tuple(ports))
