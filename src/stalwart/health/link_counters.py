"""This host's network link counters: bytes, drops and errors per interface from
``/sys/class/net/*/statistics``, the queueing disciplines' drops and over-limit counts from
``tc -s -j qdisc show``, and the bytes each worker process's own TCP connections moved, per peer
address, from ``ss -tinp`` (iproute2's socket statistics, the kernel's ``tcp_info``). What the
slow-link check (diagnose/slow_link.py) reads to tell a collective that moves data slowly from one
that moves nothing: the workers' own sockets when ``ss`` answers (traffic of other processes does not
count), the interfaces otherwise. And, for the in-place board's silent-host verdict
(launch/inplace/board.py), when the kernel last took any segment from a given host (:func:`read_heard`).

Reads are local (sysfs files, netlink dumps through ``tc`` and ``ss`` bounded by
:data:`READ_TIMEOUT_S`); nothing here touches the network. Counters of an interface that appears or disappears between two
samples are not compared (a window over them reports what both samples share).
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

SYS_NET = Path("/sys/class/net")
READ_TIMEOUT_S = 1.0  # one local netlink dump; a tc or ss that takes longer is skipped this time
HEARD_TIMEOUT_S = 0.5  # the same without ``-p`` (no walk of /proc), on the in-place board's poll thread
SAMPLE_EVERY_S = 1.0  # samples are taken at most this often (two short processes each time)
IDLE_S = 10.0  # the sampling thread ends once its samples were not asked for this long
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
    """Every non-loopback interface's counters at time ``t`` (the agent's clock), and the workers'
    TCP connections' bytes (acked sent, received) summed per peer address (None: not read)."""

    t: float
    ifaces: Mapping[str, IfCounters] = field(default_factory=lambda: MappingProxyType({}))
    peers: Mapping[str, tuple[int, int]] | None = None
    send_queued: int = 0  # bytes the workers' sockets hold unsent (the link cannot take them yet)
    qdiscs_read: bool = True  # False: ``tc`` did not answer this time, the qdisc fields are not counts


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


def read_qdiscs(timeout_s: float = READ_TIMEOUT_S) -> dict[str, tuple[str, int, int]] | None:
    """The queueing disciplines' counters by interface; None without ``tc`` or when it does not
    answer in time (on a busy host it may not): a missed read is not a reading of zero."""
    tc = shutil.which("tc")
    if tc is None:
        return None
    try:
        res = subprocess.run(
            [tc, "-s", "-j", "qdisc", "show"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_qdiscs(res.stdout) if res.returncode == 0 else None


def _peer_host(addr: str) -> str:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.removeprefix("::ffff:")


def parse_sockets(text: str, pids: Collection[int]) -> tuple[dict[str, tuple[int, int]], int]:
    """``ss -tinpH state established`` output -> the sockets of ``pids``: peer address -> (bytes
    acked, bytes received), and their unsent bytes (pure). A socket line is followed by its
    indented ``tcp_info`` line."""
    peers: dict[str, tuple[int, int]] = {}
    queued = 0
    peer, mine, sendq = "", False, 0
    for line in text.splitlines():
        if line and not line[0].isspace():
            cols = line.split()
            owners = {int(m) for m in re.findall(r"pid=(\d+)", line)}
            mine = len(cols) >= 4 and bool(owners & set(pids))
            peer, sendq = (_peer_host(cols[3]), int(cols[1]) if cols[1].isdigit() else 0) if mine else ("", 0)
            continue
        if not mine:
            continue
        info = dict(re.findall(r"(bytes_acked|bytes_received):(\d+)", line))
        sent, got = peers.get(peer, (0, 0))
        peers[peer] = (sent + int(info.get("bytes_acked", 0)), got + int(info.get("bytes_received", 0)))
        queued += sendq
        mine = False
    return peers, queued


def read_sockets(
    pids: Collection[int], timeout_s: float = READ_TIMEOUT_S
) -> tuple[dict[str, tuple[int, int]], int] | None:
    """The established TCP connections of ``pids`` (:func:`parse_sockets`); None without ``ss``."""
    ss = shutil.which("ss")
    if ss is None or not pids:
        return None
    try:
        res = subprocess.run(
            [ss, "-tinpH", "state", "established"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_sockets(res.stdout, pids) if res.returncode == 0 else None


def parse_heard(text: str, hosts: Collection[str]) -> dict[str, float]:
    """``ss -tinH state established`` output -> for each of ``hosts`` this host holds a connection
    with, the seconds since the kernel last took a segment from it: the least ``lastrcv`` (data) or
    ``lastack`` (any acknowledging segment) over every connection with that address (pure). Every
    process's sockets count: a host whose agent, store client or ranks still send anything is heard."""
    out: dict[str, float] = {}
    peer = ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            cols = line.split()
            peer = _peer_host(cols[3]) if len(cols) >= 4 else ""
            continue
        if peer not in hosts:
            continue
        ages = [int(v) for v in re.findall(r"\blast(?:rcv|ack):(\d+)", line)]
        if ages:
            out[peer] = min(out.get(peer, float("inf")), min(ages) / 1000.0)
        peer = ""
    return out


def read_heard(hosts: Collection[str], timeout_s: float = HEARD_TIMEOUT_S) -> dict[str, float] | None:
    """:func:`parse_heard` of this host's established TCP connections (one netlink dump through ``ss``,
    without ``-p``: no walk of /proc); None without ``ss`` or when it does not answer in time (no
    reading, not a silence). A loopback address is shared by every process of this host, whose
    traffic always keeps it heard: it reads as heard now without a dump (``ss`` costs CPU on a busy
    machine, and it could never confirm a silence there)."""
    shared = {h: 0.0 for h in hosts if _loopback(h)}
    remote = frozenset(hosts) - shared.keys()
    if not remote:
        return shared
    ss = shutil.which("ss")
    if ss is None:
        return None
    try:
        res = subprocess.run(
            [ss, "-tinH", "state", "established"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {**parse_heard(res.stdout, remote), **shared} if res.returncode == 0 else None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class LinkSampler:
    """Samples of this host's link counters, one per ``every_s``, kept for ``keep_s``; ``pids``: the
    worker processes whose sockets count.

    With ``clock`` (the agent's: samples share its time base) the reads run on a daemon thread, so
    the agent's tick never waits for ``ss`` or ``tc`` (on a busy host ``ss -p`` takes up to a second):
    :meth:`sample` starts it and returns the samples taken so far; the thread ends once nobody has
    asked for ``idle_s``. Without a clock, :meth:`sample` reads in the caller when ``every_s`` has
    passed (tests drive it on their own clock)."""

    def __init__(
        self,
        pids: Callable[[], Collection[int]] = lambda: (),
        sysfs: Callable[[], Mapping[str, IfCounters]] = read_sysfs,
        qdiscs: Callable[[], Mapping[str, tuple[str, int, int]] | None] = read_qdiscs,
        sockets: Callable[[Collection[int]], tuple[dict[str, tuple[int, int]], int] | None] = read_sockets,
        keep_s: float = KEEP_S,
        every_s: float = SAMPLE_EVERY_S,
        clock: Callable[[], float] | None = None,
        idle_s: float = IDLE_S,
    ) -> None:
        self._pids, self._sysfs, self._qdiscs, self._sockets = pids, sysfs, qdiscs, sockets
        self.keep_s, self.every_s, self.idle_s = keep_s, every_s, idle_s
        self.samples: deque[LinkSample] = deque()
        self._kept: tuple[LinkSample, ...] = ()
        self._clock = clock
        self._asked = 0.0
        self._thread: threading.Thread | None = None

    def sample(self, now: float) -> tuple[LinkSample, ...]:
        """Every sample kept, oldest first (taking one at ``now`` first when read in the caller)."""
        if self._clock is None:
            if not self.samples or now - self.samples[-1].t >= self.every_s:
                self._take(now)
            return self._kept
        self._asked = time.monotonic()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="stalwart-link-sampler", daemon=True)
            self._thread.start()
        return self._kept

    def _loop(self) -> None:
        assert self._clock is not None
        while time.monotonic() - self._asked < self.idle_s:
            began = time.monotonic()
            self._take(self._clock())
            time.sleep(max(0.0, self.every_s - (time.monotonic() - began)))

    def _take(self, now: float) -> None:
        read = self._qdiscs()
        q = read or {}
        ifaces = {}
        for name, c in self._sysfs().items():
            kind, drops, over = q.get(name, ("", 0, 0))
            ifaces[name] = IfCounters(c.rx_bytes, c.tx_bytes, c.dropped, kind, drops, over)
        socks = self._sockets(self._pids())
        peers, queued = (MappingProxyType(socks[0]), socks[1]) if socks is not None else (None, 0)
        self.samples.append(LinkSample(now, MappingProxyType(ifaces), peers, queued, read is not None))
        while self.samples and now - self.samples[0].t > self.keep_s:
            self.samples.popleft()
        self._kept = tuple(self.samples)  # one reference swap: the reader sees the old or the new tuple
