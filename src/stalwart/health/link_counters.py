"""This host's network link counters: bytes, drops and errors per interface from
``/sys/class/net/*/statistics``, and the queueing disciplines' drops and over-limit counts from
``tc -s -j qdisc show`` (iproute2). What the slow-link check (diagnose/slow_link.py) reads to tell a
collective that moves data slowly from one that moves nothing.

Reads are local (sysfs files, one netlink query through ``tc`` bounded by :data:`QDISC_READ_TIMEOUT_S`);
nothing here touches the network. Counters of an interface that appears or disappears between two
samples are not compared (a window over them reports what both samples share).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

SYS_NET = Path("/sys/class/net")
QDISC_READ_TIMEOUT_S = 1.0  # one local netlink dump; a tc that takes longer is skipped this time
QDISC_EVERY_S = 2.0  # the qdisc counters are read at most this often (a process each time)
KEEP_S = 180.0  # samples kept: longer than any silence the slow-link check weighs
_DEVICE_DROPS = ("rx_dropped", "tx_dropped", "rx_errors", "tx_errors")
SHAPING_QDISCS = frozenset({"tbf", "htb", "hfsc", "cbq", "netem", "cake", "police"})


@dataclass(frozen=True)
class IfCounters:
    """One interface's cumulative counters."""

    rx_bytes: int
    tx_bytes: int
    dropped: int  # the device's own drops and errors, both ways
    qdisc: str = ""  # the root queueing discipline's kind ("" when not read)
    qdisc_drops: int = 0
    qdisc_overlimits: int = 0


@dataclass(frozen=True)
class LinkSample:
    """Every non-loopback interface's counters at time ``t`` (the agent's clock)."""

    t: float
    ifaces: Mapping[str, IfCounters] = field(default_factory=lambda: MappingProxyType({}))


def _int(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def read_sysfs(root: Path = SYS_NET) -> dict[str, IfCounters]:
    """Byte and drop counters of every interface but loopback; {} when sysfs has none."""
    out: dict[str, IfCounters] = {}
    try:
        names = sorted(p.name for p in root.iterdir())
    except OSError:
        return out
    for name in names:
        if name == "lo":
            continue
        st = root / name / "statistics"
        if not st.is_dir():
            continue
        out[name] = IfCounters(
            rx_bytes=_int(st / "rx_bytes"),
            tx_bytes=_int(st / "tx_bytes"),
            dropped=sum(_int(st / k) for k in _DEVICE_DROPS),
        )
    return out


def parse_qdiscs(text: str) -> dict[str, tuple[str, int, int]]:
    """``tc -s -j qdisc show`` output -> interface -> (root qdisc kind, drops, overlimits) (pure).
    Counts of every qdisc on an interface are summed; the kind is the root's."""
    try:
        rows = json.loads(text or "[]")
    except json.JSONDecodeError:
        return {}
    out: dict[str, tuple[str, int, int]] = {}
    for q in rows if isinstance(rows, list) else []:
        if not isinstance(q, dict) or not isinstance(q.get("dev"), str):
            continue
        kind, drops, over = out.get(q["dev"], ("", 0, 0))
        if q.get("root"):
            kind = str(q.get("kind", ""))
        out[q["dev"]] = (kind, drops + int(q.get("drops", 0) or 0), over + int(q.get("overlimits", 0) or 0))
    return out


def read_qdiscs(timeout_s: float = QDISC_READ_TIMEOUT_S) -> dict[str, tuple[str, int, int]]:
    """The queueing disciplines' counters by interface; {} without ``tc`` or when it does not answer."""
    tc = shutil.which("tc")
    if tc is None:
        return {}
    try:
        res = subprocess.run(
            [tc, "-s", "-j", "qdisc", "show"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_qdiscs(res.stdout) if res.returncode == 0 else {}


class LinkSampler:
    """Samples of this host's link counters, one per call, kept for ``keep_s`` (the agent's tick calls
    :meth:`sample`). The qdisc counters are re-read every ``qdisc_every_s`` and carried between."""

    def __init__(
        self,
        sysfs: Callable[[], Mapping[str, IfCounters]] = read_sysfs,
        qdiscs: Callable[[], Mapping[str, tuple[str, int, int]]] = read_qdiscs,
        keep_s: float = KEEP_S,
        qdisc_every_s: float = QDISC_EVERY_S,
    ) -> None:
        self._sysfs, self._qdiscs = sysfs, qdiscs
        self.keep_s, self.qdisc_every_s = keep_s, qdisc_every_s
        self.samples: deque[LinkSample] = deque()
        self._q: Mapping[str, tuple[str, int, int]] = {}
        self._q_at = float("-inf")

    def sample(self, now: float) -> tuple[LinkSample, ...]:
        """Take a sample at ``now``; every sample kept, oldest first."""
        if now - self._q_at >= self.qdisc_every_s:
            self._q, self._q_at = self._qdiscs(), now
        ifaces = {}
        for name, c in self._sysfs().items():
            kind, drops, over = self._q.get(name, ("", 0, 0))
            ifaces[name] = IfCounters(c.rx_bytes, c.tx_bytes, c.dropped, kind, drops, over)
        self.samples.append(LinkSample(now, MappingProxyType(ifaces)))
        while self.samples and now - self.samples[0].t > self.keep_s:
            self.samples.popleft()
        return tuple(self.samples)
