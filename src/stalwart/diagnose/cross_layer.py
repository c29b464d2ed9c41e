"""Cross-layer diagnosis: a communication symptom joined with node evidence names the real cause.

"Every error looks like an NCCL error": a watchdog timeout on every rank says only that some rank
never finished a collective. The rules (data, ``rules.yaml``) join the symptom with the health
findings and kernel-log lines of the job's nodes inside a window ``[t0 - before_s, t0 + after_s]``
around the first symptom ``t0``. The first rule with a matching signal decides; when none matches,
the incident says so (communication error, cause not found) with a low confidence.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..terminal import shorten
from .incident import BlastRadius, Component, FaultClass, Incident
from .rule_file import load_rule_file
from .signals import Signal

COMM_CODES = ("comm.timeout", "comm.error", "process.hang")  # the symptoms a rule explains


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    code: str
    xid: tuple[int, ...] | None = None

    def hits(self, s: Signal) -> bool:
        if not fnmatch.fnmatchcase(s.code, self.code):
            return False
        return self.xid is None or s.evidence.get("xid") in self.xid


class CrossRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    match: tuple[Match, ...] = Field(min_length=1)
    cause: str
    fault_class: FaultClass
    component: Component
    confidence: float = Field(ge=0.0, le=1.0)
    action: str
    same_node: bool = False
    same_rank: bool = False  # only signals of a rank that showed the symptom
    # only signals at most this long before the first symptom count (None: the table's window)
    within_s: float | None = Field(default=None, ge=0)


class Window(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    before_s: float = Field(default=900.0, ge=0)
    after_s: float = Field(default=120.0, ge=0)


class CrossRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    window: Window = Window()
    other_node_factor: float = Field(default=0.9, ge=0.0, le=1.0)
    rules: tuple[CrossRule, ...] = Field(min_length=1)


def load_cross_rules(path: str | Path | None = None) -> CrossRules:
    """The shipped rules, or a site's own YAML file in the same format."""
    return load_rule_file(CrossRules, "rules.yaml", "diagnosis rules", path)


class _Fmt(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def diagnose_comm_failure(
    symptoms: Sequence[Signal],
    evidence: Sequence[Signal],
    now: float,
    rules: CrossRules | None = None,
    *,
    gpus: int = 0,
) -> Incident | None:
    """One incident for one communication failure or hang (all ranks' symptom signals of one interruption).

    ``evidence``: signals from the job's nodes (findings, kernel log, process states), any time; only
    those inside the window count. ``gpus``: the job's size, for the cost of the time from the first
    symptom to ``now``. ``None`` when ``symptoms`` holds no communication signal.
    """
    table = rules or load_cross_rules()
    comm = sorted((s for s in symptoms if s.code in COMM_CODES), key=lambda s: s.ts)
    if not comm:
        return None
    t0 = comm[0].ts
    lo, hi = t0 - table.window.before_s, t0 + table.window.after_s
    symptom_nodes = {s.node for s in comm}
    inside = sorted(
        (s for s in evidence if lo <= s.ts <= hi and s.code not in COMM_CODES), key=lambda s: s.ts
    )
    first = comm[0]
    head = (
        f"symptom: {len(comm)} communication failure(s) on {len(symptom_nodes)} node(s), first {first.line()}"
    )
    cost = gpus * max(0.0, now - t0)
    symptom_ranks = {(s.node, s.rank) for s in comm}
    for rule in table.rules:
        hits = [s for s in inside if any(m.hits(s) for m in rule.match)]
        if rule.within_s is not None:
            hits = [s for s in hits if s.ts >= t0 - rule.within_s]
        if rule.same_node:
            hits = [s for s in hits if s.node in symptom_nodes]
        if rule.same_rank:
            hits = [s for s in hits if (s.node, s.rank) in symptom_ranks]
        if not hits:
            continue
        local = [s for s in hits if s.node in symptom_nodes]
        top = (local or hits)[0]
        conf = rule.confidence if local else rule.confidence * table.other_node_factor
        fmt = _Fmt({**top.evidence, "subject": top.subject, "node": top.node, "text": top.text})
        onset = min(top.ts, t0)
        ranks = tuple(sorted({s.rank for s in comm if s.node == top.node and s.rank >= 0}))
        return Incident(
            cause=rule.cause.format_map(fmt),
            fault_class=rule.fault_class,
            component=rule.component,
            confidence=round(conf, 4),
            action=rule.action,
            ts=now,
            onset=onset,
            rule=f"cross_layer:{rule.name}",
            evidence=(head, *(s.line() for s in hits[:8])),
            blast_radius=BlastRadius(nodes=(top.node,), ranks=ranks),
            cost_gpu_s=cost,
            subject=top.subject,
        )
    what = "hang" if all(s.code == "process.hang" for s in comm) else "communication failure"
    return Incident(
        cause=f"{what} with no node-level cause in the window (first: {shorten(first.text, 120)})",
        fault_class=FaultClass.UNKNOWN,
        component=Component.COMMUNICATION,
        confidence=0.3,
        action="restart_and_collect",
        ts=now,
        onset=t0,
        rule="cross_layer:no-cause",
        evidence=(
            head,
            f"no finding or kernel-log line on {len(inside)} signal(s) in "
            f"[{lo:.0f}, {hi:.0f}] matched a rule",
        ),
        blast_radius=BlastRadius(
            nodes=tuple(sorted(symptom_nodes)), ranks=tuple(sorted({s.rank for s in comm if s.rank >= 0}))
        ),
        cost_gpu_s=cost,
    )
