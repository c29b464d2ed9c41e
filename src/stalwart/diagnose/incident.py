"""One incident model: what went wrong, where it sits, how sure we are, what to do and what it cost.

Every diagnosis in this package (cross-layer rules, cooling and shared-cause seams, straggler
actions, silent collectors, routing around a sick link) returns an :class:`Incident`. It is a frozen
value: the agent logs it, turns it into an :class:`~stalwart.events.IncidentRaised` ledger event with
:meth:`Incident.to_event`, and acts on ``action``.

Cost is kept in GPU-seconds here (diagnose sits below account/ in the dependency order); the
accounting package prices GPU-seconds with its own ``Prices``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..events import IncidentRaised
from ..policy.vocabulary import Component, FaultClass


@dataclass(frozen=True)
class BlastRadius:
    """What the cause touches: ranks, nodes and the topology domain they share (``leaf_switch:sw3``)."""

    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    domain: str = ""  # "" = the named nodes only

    def describe(self) -> str:
        where = self.domain or (", ".join(self.nodes) if self.nodes else "unknown")
        ranks = f" (ranks {', '.join(str(r) for r in self.ranks)})" if self.ranks else ""
        return where + ranks


@dataclass(frozen=True)
class Incident:
    cause: str  # one line naming the real cause
    fault_class: FaultClass
    component: Component
    confidence: float  # 0..1
    action: str  # recommended (or, with action_taken, carried out)
    ts: float  # when the diagnosis was made (the injected ``now``)
    onset: float  # best estimate of when the fault began
    rule: str  # the rule or policy that produced it
    evidence: tuple[str, ...] = ()
    blast_radius: BlastRadius = field(default_factory=BlastRadius)
    cost_gpu_s: float = 0.0
    action_taken: bool = False
    env: tuple[tuple[str, str], ...] = ()  # environment changes for the next attempt (route around)
    subject: str = ""  # the part the evidence names (mlx5_0/1, gpu3, /data), when one signal names it

    def __post_init__(self) -> None:
        if not (0.0 <= self.confidence <= 1.0):
            raise ConfigError(f"incident confidence must be within 0..1, got {self.confidence!r}")
        if not (self.cost_gpu_s >= 0 and math.isfinite(self.cost_gpu_s)):
            raise ConfigError(f"incident cost must be a finite non-negative number, got {self.cost_gpu_s!r}")

    @property
    def summary(self) -> str:
        verb = "took" if self.action_taken else "recommend"
        cost = f"; cost {self.cost_gpu_s / 3600.0:,.2f} GPU-h" if self.cost_gpu_s else ""
        return (
            f"{self.cause} [{self.fault_class.value}/{self.component.value}, confidence "
            f"{self.confidence:.2f}; {verb} {self.action}; blast radius {self.blast_radius.describe()}{cost}]"
        )

    def to_event(self, run_id: str = "", node: str = "", attempt: int = -1) -> IncidentRaised:
        return IncidentRaised(
            ts=self.ts,
            run_id=run_id,
            node=node or (self.blast_radius.nodes[0] if self.blast_radius.nodes else ""),
            attempt=attempt,
            rank=self.blast_radius.ranks[0] if len(self.blast_radius.ranks) == 1 else -1,
            cause=self.cause,
            fault_class=self.fault_class.value,
            component=self.component.value,
            confidence=self.confidence,
            action=self.action,
            action_taken=self.action_taken,
            rule=self.rule,
            onset=self.onset,
            evidence=self.evidence,
            nodes=self.blast_radius.nodes,
            ranks=self.blast_radius.ranks,
            domain=self.blast_radius.domain,
            cost_gpu_s=self.cost_gpu_s,
            env=dict(self.env),
        )


def slowdown_cost_gpu_s(gpus: int, slowdown: float, duration_s: float) -> float:
    """GPU-seconds lost while a job ran ``slowdown`` times slower than normal for ``duration_s``.

    In synchronous training every GPU waits for the slowest, so the lost fraction of the whole job is
    ``1 - 1/slowdown``."""
    if gpus < 0 or duration_s < 0 or slowdown <= 0:
        raise ConfigError(
            f"slowdown cost needs gpus >= 0, duration >= 0, slowdown > 0; got {gpus}, "
            f"{duration_s}, {slowdown}"
        )
    return gpus * duration_s * max(0.0, 1.0 - 1.0 / slowdown)


def event_line(ev: IncidentRaised) -> str:
    """One line per raised incident: the same words on the live console and in the report."""
    verb = "took" if ev.action_taken else "recommend"
    where = ev.domain or ", ".join(ev.nodes) or ev.node or "unknown"
    ranks = f" (ranks {', '.join(str(r) for r in ev.ranks)})" if ev.ranks else ""
    cost = f"; cost {ev.cost_gpu_s / 3600.0:,.3f} GPU-h" if ev.cost_gpu_s else ""
    return (
        f"{ev.cause} [{ev.fault_class}/{ev.component}, confidence {ev.confidence:.2f}; {verb} "
        f"{ev.action}; blast radius {where}{ranks}{cost}]"
    )


@dataclass(frozen=True)
class LostHost:
    """The host a peer loss is attributed to, and how it was told."""

    node: str
    how: str  # "named by the transport" | "the only other host of the round"


def lost_host(witness: str, active: tuple[str, ...], text: str) -> LostHost | None:
    """The host that left, seen from ``witness`` (a host of the round ``active`` whose rank lost a peer
    with the transport's ``text``): the one other host the text names (by name or address), else the
    only other host of the round; None when neither tells (several hosts, none named)."""
    others = [n for n in active if n != witness]
    named = [n for n in others if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-]|\.\d)", text)]
    if len(named) == 1:
        return LostHost(named[0], "named by the transport")
    if len(others) == 1:
        return LostHost(others[0], "the only other host of the round")
    return None


SILENT_HOST_CONFIDENCE = 0.6  # a heartbeat silent past its bound while the peers' ranks wait for it
DEAD_AGENT_CONFIDENCE = 0.95  # the kernel closed the agent's connection: its process is gone


def dead_agent_incident(
    lost: tuple[str, ...], witness: str, onset: float, now: float, action: str, *, left: bool = False
) -> Incident:
    """The incident of hosts whose agent process died while their kernel lived: the kernel closed the
    agent's liveness connection (launch/inplace/liveness.py), so the witness knew at once, with no
    heartbeat bound to wait out. What killed the agent is not seen from here: the class stays unknown.

    ``left``: the agent left the running job on purpose instead: it excluded its own node (a straggler
    worth more out than in, or a node that corrupted a replica silently) and said so on its liveness
    line. Why it left is in that agent's own ledger (``DecisionTaken`` ``exclude_quarantine`` or
    ``sdc_exclude``), not seen from here."""
    gone = ", ".join(lost)
    how = (
        "left the job on purpose: its agent excluded its own node (its ledger says why)"
        if left
        else "left the job: its agent died (its process is gone: the kernel closed its liveness connection)"
    )
    line_end = "with the leaving byte" if left else "without a goodbye"
    return Incident(
        cause=f"host {gone} {how} while the ranks of {witness} waited",
        fault_class=FaultClass.UNKNOWN,
        component=Component.UNKNOWN,
        confidence=DEAD_AGENT_CONFIDENCE,
        action=action,
        ts=now,
        onset=onset,
        rule="inplace:node-left" if left else "inplace:dead-agent",
        evidence=tuple(f"lost host {n}: its agent's liveness connection ended {line_end}" for n in lost)
        + (f"witness {witness}: its ranks lost a peer and waited for a new generation",),
        blast_radius=BlastRadius(nodes=lost),
        action_taken=True,
    )


def silent_host_incident(
    lost: tuple[str, ...], witness: str, silent_s: float, now: float, action: str, waited: bool = True
) -> Incident:
    """The incident of hosts whose agents fell silent (no heartbeat past its bound) while ``witness``'s
    ranks waited for them, or (``waited`` False) before any rank noticed: nothing at all came from the
    host for as long (its ranks' collective blocks without an error when no connection resets). The
    lost hosts are the blast radius, the witness is named as such. A host that vanishes this way
    (powered off, cut off the network) leaves no exit code and no error text, so neither says which
    part failed: the class stays unknown."""
    gone = ", ".join(lost)
    if waited:
        cause = (
            f"host {gone} left the job: no heartbeat for {silent_s:.1f}s while the ranks of {witness} waited"
        )
        seen = tuple(f"lost host {n}: no heartbeat for {silent_s:.1f}s" for n in lost)
        why = (f"witness {witness}: its ranks lost a peer and waited for a new generation",)
    else:
        cause = (
            f"host {gone} left the job: silent for {silent_s:.1f}s (no heartbeat, and nothing from its "
            f"host on any connection of {witness}'s) while the ranks were blocked in a step with it"
        )
        seen = tuple(
            f"lost host {n}: no heartbeat and no segment on any connection for {silent_s:.1f}s" for n in lost
        )
        why = (f"witness {witness}: its kernel took nothing from the host, so no slow link delays its beats",)
    return Incident(
        cause=cause,
        fault_class=FaultClass.UNKNOWN,
        component=Component.UNKNOWN,
        confidence=SILENT_HOST_CONFIDENCE,
        action=action,
        ts=now,
        onset=now - silent_s,
        rule="inplace:silent-host",
        evidence=seen + why,
        blast_radius=BlastRadius(nodes=lost),
        action_taken=True,
    )
