"""A silent rank: a hang, or a collective crawling over a slow link? (pure policy)

The hang monitor sees a rank silent past its hang timeout. Whether the rank is stuck or still
working is told by the host's links over the silence (health/link_counters.py): a collective that
makes progress keeps moving bytes; one that waits on a hung peer moves nothing. Slow progress is not a
hang: restarting the group does not make a slow link faster.

Which host's link is slow: this host's own when its interfaces show the bottleneck (a shaping qdisc
over its limit, drops or errors during the silence); otherwise a peer's, named when the job has one
other host. A silence past ``ceiling_s`` (the process-group timeout, which fails the collective
anyway) is a hang whatever the link does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from typing_extensions import assert_never

from ..health.link_counters import SHAPING_QDISCS, LinkSample
from ..policy.label import Label
from .incident import BlastRadius, Component, FaultClass, Incident
from .straggler import COMM_SECTIONS

WORKERS = "the workers' connections"
RECENT_S = 3.0  # the link must still be moving data over the newest seconds of the silence
# sections a collective can run in: the comm sections, a forward (parameter all-gathers) and a rank
# whose section is unknown (step hooks without the SDK's sections)
COLLECTIVE_SECTIONS = frozenset(COMM_SECTIONS | {"forward"})


@dataclass(frozen=True)
class LinkWindow:
    """What this host's links did between two samples (the silence)."""

    seconds: float
    bytes: int  # received + sent: the workers' own connections when read, else every interface's
    recent_bps: float  # bytes per second over the newest ``RECENT_S`` of the window
    drops: int  # device drops/errors and qdisc drops
    overlimits: int  # times a shaping qdisc held packets over its rate
    shaped: str  # "tbf on eth0" for the interfaces with a shaping root qdisc, "" without
    source: str = "this host's interfaces"  # or "the workers' connections"
    per_peer: str = ""  # "10.77.0.1 368,068 bytes" per peer address, busiest first (the workers')
    send_queued: int = 0  # bytes the workers' sockets held unsent at the newest sample

    @property
    def bps(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


def _delta(a: LinkSample, b: LinkSample) -> tuple[int, int]:
    """Interface bytes moved and device drops/errors from ``a`` to ``b``."""
    moved = drops = 0
    for name, y in b.ifaces.items():
        x = a.ifaces.get(name)
        if x is None:
            continue
        moved += max(0, y.rx_bytes - x.rx_bytes) + max(0, y.tx_bytes - x.tx_bytes)
        drops += max(0, y.dropped - x.dropped)
    return moved, drops


def _qdisc_delta(inside: Sequence[LinkSample]) -> tuple[int, int, LinkSample | None]:
    """Qdisc drops and over-limits between the oldest and newest samples whose ``tc`` read answered
    (a read that timed out is not a count of zero), and the newest such sample."""
    read = [s for s in inside if s.qdiscs_read]
    if not read:
        return 0, 0, None
    a, b = read[0], read[-1]
    drops = over = 0
    for name, y in b.ifaces.items():
        x = a.ifaces.get(name)
        if x is None:
            continue
        drops += max(0, y.qdisc_drops - x.qdisc_drops)
        over += max(0, y.qdisc_overlimits - x.qdisc_overlimits)
    return drops, over, b


def _peer_delta(a: LinkSample, b: LinkSample) -> dict[str, int]:
    """Bytes the workers' connections moved per peer from ``a`` to ``b`` (both read)."""
    if a.peers is None or b.peers is None:
        return {}
    out = {}
    for peer, (sent, got) in b.peers.items():
        s0, g0 = a.peers.get(peer, (sent, got))  # a connection opened in between: from its first sight
        out[peer] = max(0, sent - s0) + max(0, got - g0)
    return out


def _moved(a: LinkSample, b: LinkSample) -> int:
    if a.peers is not None and b.peers is not None:
        return sum(_peer_delta(a, b).values())
    return _delta(a, b)[0]


def link_window(samples: Sequence[LinkSample], since: float, recent_s: float = RECENT_S) -> LinkWindow | None:
    """The window inside the silence: from the oldest sample at or after ``since`` to the newest one
    (traffic from before the silence never counts as progress); None without two such samples. Bytes are the
    workers' own connections' between the oldest and newest samples whose ``ss`` read answered
    (other processes' traffic does not count; a read that timed out on a busy host is skipped, not
    taken for silence), the interfaces' when fewer than two did."""
    inside = [s for s in samples if s.t >= since]
    if len(inside) < 2 or inside[-1].t <= inside[0].t:
        return None
    # whether this host's own link throttled or dropped is counted over the whole silence, from the
    # newest sample before it: a host whose rate limit held its sends at the start of a collective
    # and that only receives at the end (its ingress is shaped where it cannot see) is still the one
    before = [s for s in samples if s.t < since][-1:]
    _, device_drops = _delta((before or inside)[0], inside[-1])
    qdisc_drops, over, shaping = _qdisc_delta(before + inside)
    read = [s for s in inside if s.peers is not None]
    sockets = len(read) >= 2 and read[-1].t > read[0].t
    span = read if sockets else inside
    first, last = span[0], span[-1]
    tail = next((s for s in reversed(span) if s.t <= last.t - recent_s), first)
    peers = sorted(_peer_delta(first, last).items(), key=lambda kv: -kv[1])
    shaped = ", ".join(
        f"{c.qdisc} on {name}"
        for name, c in sorted(shaping.ifaces.items() if shaping is not None else ())
        if c.qdisc in SHAPING_QDISCS
    )
    return LinkWindow(
        seconds=last.t - first.t,
        bytes=_moved(first, last) if sockets else _delta(first, last)[0],
        recent_bps=(_moved(tail, last) if sockets else _delta(tail, last)[0]) / (last.t - tail.t)
        if last.t > tail.t
        else 0.0,
        drops=device_drops + qdisc_drops,
        overlimits=over,
        shaped=shaped,
        source=WORKERS if sockets else "this host's interfaces",
        per_peer=", ".join(f"{p} {n:,} bytes" for p, n in peers if n),
        send_queued=last.send_queued,
    )


class SilenceKind(Label):
    """What a rank's silence past its hang timeout is."""

    HANG = "hang"  # nothing moves: restart (the hang monitor's own verdict stands)
    SLOW_LINK = "slow_link"  # the collective moves data, slowly: not a hang


@dataclass(frozen=True)
class Silence:
    """A silent rank as the hang monitor sees it."""

    node: str
    peers: tuple[str, ...]  # the job's other hosts
    rank: int
    section: str | None
    silence_s: float
    timeout_s: float  # the hang timeout it is past
    ceiling_s: float  # past this a silence is a hang whatever the link does (the collective's timeout)
    step_s: float  # the healthy step time (0: unknown)


@dataclass(frozen=True)
class SilenceVerdict:
    kind: SilenceKind
    reason: str
    host: str = ""  # the host whose link is slow ("" for a hang or when it cannot be told)
    local: bool = False  # the evidence is this host's own interfaces
    slowdown: float = 1.0  # the step so far over the healthy step time (a lower bound)
    confidence: float = 0.0

    @property
    def slow_link(self) -> bool:
        match self.kind:
            case SilenceKind.SLOW_LINK:
                return True
            case SilenceKind.HANG:
                return False
            case _:
                assert_never(self.kind)


def _kbit(bps: float) -> str:
    return f"{bps * 8 / 1000:,.0f} kbit/s"


def judge_silence(s: Silence, window: LinkWindow | None, min_bps: float) -> SilenceVerdict:
    """A hang, or a slow link on a named host, and why. ``min_bps``: the traffic (bytes/s, both ways)
    that counts as a collective making progress; 0 turns the check off."""
    hang = SilenceKind.HANG
    if min_bps <= 0:
        return SilenceVerdict(hang, "slow-link check off")
    if s.silence_s >= s.ceiling_s:
        return SilenceVerdict(
            hang,
            f"silent {s.silence_s:.1f}s, past the collective's timeout {s.ceiling_s:g}s: a hang even if slow",
        )
    if s.section is not None and s.section not in COLLECTIVE_SECTIONS:
        return SilenceVerdict(hang, f"rank {s.rank} is silent in '{s.section}', where no collective runs")
    if not s.peers:  # one host: its ranks talk over loopback, no link between hosts can be slow
        return SilenceVerdict(hang, "the job runs on one host: no link between hosts")
    if window is None:
        return SilenceVerdict(hang, "no link counters on this host")
    if window.source != WORKERS:  # a NIC's bytes include every other process's: no evidence of the job's
        return SilenceVerdict(hang, "the workers' own connections could not be read, only the interfaces'")
    # a trickle at the end still counts (TCP backs off after a drop); a link gone quiet does not
    if window.recent_bps < min_bps / 4 or window.bps < min_bps:
        return SilenceVerdict(
            hang,
            f"{window.source} moved {window.bytes:,} bytes in {window.seconds:.1f}s ({_kbit(window.bps)}, "
            f"newest {RECENT_S:g}s {_kbit(window.recent_bps)}; progress needs {_kbit(min_bps)}, a quarter of it at the end): nothing moves",
        )
    slowdown = max(1.0, s.silence_s / s.step_s) if s.step_s > 0 else 1.0
    peers = f"; to and from {window.per_peer}" if window.per_peer else ""
    queued = f"; {window.send_queued:,} bytes wait to be sent" if window.send_queued else ""
    moving = (
        f"rank {s.rank} silent {s.silence_s:.1f}s in {f'{s.section!r}' if s.section else 'its step'} "
        f"(hang timeout {s.timeout_s:.1f}s, healthy step {s.step_s:.2f}s) while {window.source} move "
        f"{_kbit(window.bps)} ({window.bytes:,} bytes{peers}{queued}): the collective is slow, not stuck"
    )
    if window.overlimits or window.drops:
        shaped = f"{window.shaped}: " if window.shaped else ""
        why = (
            f"{moving}; this host's link is the bottleneck ({shaped}{window.overlimits} over-limit, "
            f"{window.drops} dropped during the silence)"
        )
        return SilenceVerdict(SilenceKind.SLOW_LINK, why, s.node, True, slowdown, 0.9)
    if len(s.peers) == 1 and window.send_queued and not window.shaped:
        # its sends wait and its link has no shaper that could hold them (nor its acknowledgements): the
        # path out is slow past this host. A host whose own link is shaped may be the slow end itself
        # even with no over-limit in the window (its sends wait on acknowledgements its shaper paces):
        # it names no host below rather than blame a healthy peer
        why = (
            f"{moving}; this host's sends wait and its link shows no drops or throttling: the slow end is "
            f"its one peer {s.peers[0]}"
        )
        return SilenceVerdict(SilenceKind.SLOW_LINK, why, s.peers[0], False, slowdown, 0.6)
    if len(s.peers) == 1 and window.send_queued:
        why = (
            f"{moving}; this host's sends wait, and its link ({window.shaped}) shows no drops or "
            f"over-limits in the window: the data is slow coming in, from {s.peers[0]}'s link or paced by "
            "this host's own shaper: which end is not known here"
        )
        return SilenceVerdict(SilenceKind.SLOW_LINK, why, "", False, slowdown, 0.5)
    if len(s.peers) == 1:
        # nothing waits to be sent: the data is slow coming in, held either by the peer's link or by
        # this host's own receiving side shaped where it cannot see (a switch port): not known here
        why = (
            f"{moving}; this host's link shows no drops or throttling and nothing waits to be sent: the "
            f"data is slow coming in, from {s.peers[0]}'s link or to this host's receiving side (shaped "
            "outside it): which end is not known here"
        )
        return SilenceVerdict(SilenceKind.SLOW_LINK, why, "", False, slowdown, 0.5)
    why = f"{moving}; this host's link shows no drops or throttling: the slow link is a peer's"
    return SilenceVerdict(SilenceKind.SLOW_LINK, why, "", False, slowdown, 0.5)


def slow_link_incident(v: SilenceVerdict, node: str, rank: int, now: float, onset: float) -> Incident:
    """The incident of a slow-link verdict: the slow host is the blast radius; a witness says so."""
    where = f"on host {v.host}" if v.host else "between hosts (which end is not known here)"
    evidence = (v.reason,) if v.local else (v.reason, f"witness {node}: rank {rank}")
    return Incident(
        cause=f"slow link {where}: collectives crawl ({v.slowdown:.1f}x the healthy step so far), not a hang",
        fault_class=FaultClass.HARDWARE if v.local else FaultClass.UNKNOWN,
        component=Component.NIC,
        confidence=v.confidence,
        action="keep training without a restart (a restart does not speed up a link); the straggler policy weighs excluding the host",
        ts=now,
        onset=onset,
        rule="monitor:slow-link",
        evidence=evidence,
        blast_radius=BlastRadius(nodes=(v.host,) if v.host else (), ranks=(rank,) if v.local else ()),
    )
