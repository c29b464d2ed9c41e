"""Signals: every layer's observations on one timeline, keyed by node and time.

A :class:`Signal` is the common shape the cross-layer rules join on: a communication error from a
rank, a health finding, a kernel-log Xid, a straggler. Adapters below build them from ledger events,
health findings and kernel-log observations. Pure functions; nothing here reads a clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..events import DecisionTaken, Event, FailureDetected, StackCaptured, StragglerDetected
from ..health.findings import Finding, Severity
from ..health.kernel_log import KernelLogObservation
from ..protocol.error_record import COMM_TEXT, COMM_TYPES
from ..terminal import clock, shorten
from .pyspy import STOPPED

# The comm test of the crash classifier, plus the PyTorch watchdog's words.
_WATCHDOG = re.compile(r"\bwatchdog\b", re.IGNORECASE)
_TIMEOUT_TEXT = re.compile(r"\b(timed? ?out|timeout|watchdog)\b", re.IGNORECASE)
# NCCL's IB transport names the local HCA in completion errors: "... vendor_err=129 hca mlx5_3"
_HCA_TEXT = re.compile(r"\bhca (?P<hca>[A-Za-z0-9_]+)\b")


@dataclass(frozen=True)
class Signal:
    ts: float  # wall clock, seconds since the epoch
    node: str
    code: str  # comm.timeout, comm.error, gpu.xid, ib.state, mount.hung, gpu.clock.hw_thermal, straggler, ...
    subject: str = ""  # gpu0, mlx5_0/1, /data, rank3
    text: str = ""  # one human-readable evidence line
    rank: int = -1
    # Any: evidence is JSON of any shape (json.dumps)
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        who = f"{self.node} rank {self.rank}" if self.rank >= 0 else self.node
        return f"{who} at {clock(self.ts)}: {self.text or self.code}"


def is_comm_text(error_type: str, text: str) -> bool:
    return bool(COMM_TYPES.search(error_type) or COMM_TEXT.search(text[:500]) or _WATCHDOG.search(text[:500]))


def from_failure(ev: FailureDetected) -> Signal:
    """A failure as a signal: ``comm.timeout``/``comm.error`` when it looks like the communication
    layer, ``process.hang`` for a hang (both are symptoms to explain), else ``process.<failure>``."""
    text = f"{ev.evidence} {ev.error_message}".strip()
    comm = ev.failure == "peer_lost" or is_comm_text(ev.error_type, text)
    if ev.failure == "hang":
        code = "process.hang"  # silent past the hang timeout: a symptom too, the rank is the culprit
    elif comm:
        code = "comm.timeout" if _TIMEOUT_TEXT.search(text) else "comm.error"
    else:
        code = f"process.{ev.failure}"
    evidence: dict[str, str] = {"failure": ev.failure}
    m = _HCA_TEXT.search(text)
    if m:
        evidence["hca"] = m.group("hca")
    line = f"{ev.failure}: {(ev.error_type + ': ') if ev.error_type else ''}{shorten(text, 200)}"
    return Signal(
        ts=ev.onset or ev.ts,
        node=ev.node,
        code=code,
        subject=f"rank{ev.rank}",
        text=line,
        rank=ev.rank,
        evidence=evidence,
    )


def from_stack(ev: StackCaptured) -> Signal | None:
    """``process.stopped`` for a rank whose stack had to be read from outside because it was
    stopped (state T: SIGSTOP, SIGTSTP or a debugger): it could not run, whatever its peers did."""
    if not ev.stack.startswith(STOPPED):
        return None
    return Signal(
        ts=ev.ts,
        node=ev.node,
        code="process.stopped",
        subject=f"rank {ev.rank}",
        text=f"rank {ev.rank} was stopped (state T) when its hang was detected",
        rank=ev.rank,
    )


def from_injection(ev: FailureDetected) -> Signal | None:
    """``chaos.injected`` for a failure the run's chaos plan caused on purpose (its entry named)."""
    if not ev.injected:
        return None
    return Signal(
        ts=ev.onset or ev.ts,
        node=ev.node,
        code="chaos.injected",
        subject=f"rank {ev.rank}",
        text=f"rank {ev.rank} {ev.failure}: injected by the chaos plan ({ev.injected})",
        rank=ev.rank,
        evidence={"injected": ev.injected},
    )


EXCLUSIONS = {  # an agent's decision that took its own node out of the running job: its signal code
    "exclude_quarantine": "agent.node_excluded",  # a straggler worth more out than in
    "sdc_exclude": "agent.node_excluded_sdc",  # it corrupted a replica silently (policy/sdc.py)
}


def from_exclusion(ev: DecisionTaken) -> Signal | None:
    """An agent that excluded its own node (a straggler worth more out than in, or a node that
    corrupted a replica silently): its peers lose it, and their communication failure is that
    exclusion's cascade. Observe-only records, and a quarantine that kept the node in, are not."""
    code = EXCLUSIONS.get(ev.action)
    if code is None:
        return None
    return Signal(
        ts=ev.ts,
        node=ev.node,
        code=code,
        subject=ev.node,
        text=f"the agent of {ev.node} excluded its node: {shorten(ev.reason, 200)}",
    )


def from_straggler(ev: StragglerDetected) -> Signal:
    return Signal(
        ts=ev.ts,
        node=ev.node,
        code="straggler",
        subject=f"rank{ev.rank}",
        text=f"straggler score {ev.score:.2f} at step {ev.step}: {ev.evidence}",
        rank=ev.rank,
        evidence={"score": ev.score, "step": ev.step},
    )


def from_findings(
    findings: Iterable[Finding], node: str, ts: float, *, min_severity: Severity = Severity.WARN
) -> tuple[Signal, ...]:
    """Health findings of one check on ``node`` at ``ts``. A series finding with ``first_t`` (seconds
    into the recording) is placed at ``ts + first_t``: pass the recording's start as ``ts``."""
    out = []
    for f in findings:
        if f.severity < min_severity:
            continue
        at = ts + float(f.evidence["first_t"]) if "first_t" in f.evidence else ts
        out.append(
            Signal(
                ts=at,
                node=node,
                code=f.code,
                subject=f.subject,
                text=f"{f.subject}: {f.message}",
                evidence=dict(f.evidence),
            )
        )
    return tuple(out)


def from_health_event(ev: Event) -> tuple[Signal, ...]:
    """The findings recorded in a ``HealthChecked`` ledger event (dicts, as the ledger stores them)."""
    out = []
    for d in getattr(ev, "findings", ()) or ():
        sev = str(d.get("severity", "info")).upper()
        if sev not in ("WARN", "FAIL"):
            continue
        subject = str(d.get("subject", ""))
        out.append(
            Signal(
                ts=ev.ts,
                node=ev.node,
                code=str(d.get("code", "")),
                subject=subject,
                text=f"{subject}: {d.get('message', '')}",
                evidence=dict(d.get("evidence") or {}),
            )
        )
    return tuple(out)


def from_kernel_log(
    obs: KernelLogObservation,
    node: str,
    boot_epoch: float,
    *,
    bdf_to_gpu: Mapping[str, str] | None = None,
    undated_ts: float | None = None,
) -> tuple[Signal, ...]:
    """Xid lines as signals. ``boot_epoch`` (wall-clock time of boot) turns dmesg's seconds-since-boot
    into wall time; undated lines get ``undated_ts`` or are dropped when it is ``None``."""
    names = bdf_to_gpu or {}
    out = []
    for x in obs.xids:
        if x.t_boot is not None:
            at = boot_epoch + x.t_boot
        elif undated_ts is not None:
            at = undated_ts
        else:
            continue
        out.append(
            Signal(
                ts=at,
                node=node,
                code="gpu.xid",
                subject=names.get(x.bdf, x.bdf),
                text=f"kernel log: {shorten(x.line.strip(), 200)}",
                evidence={"xid": x.xid, "bdf": x.bdf},
            )
        )
    return tuple(out)


def from_ps_states(text: str, node: str, ts: float, ranks_by_pid: Mapping[int, int]) -> tuple[Signal, ...]:
    """``process.dstate`` for worker processes in uninterruptible sleep, from ``ps -o pid=,stat=,wchan=``
    output (one process per line). A rank stuck in D state is blocked in the kernel, usually on I/O."""
    out = []
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        pid, stat = int(parts[0]), parts[1]
        if pid not in ranks_by_pid or not stat.startswith("D"):
            continue
        wchan = parts[2] if len(parts) > 2 and parts[2] != "-" else "?"
        rank = ranks_by_pid[pid]
        out.append(
            Signal(
                ts=ts,
                node=node,
                code="process.dstate",
                subject=f"rank{rank}",
                text=f"pid {pid} (rank {rank}) in D state, waiting in {wchan}",
                rank=rank,
                evidence={"pid": pid, "stat": stat, "wchan": wchan},
            )
        )
    return tuple(out)
