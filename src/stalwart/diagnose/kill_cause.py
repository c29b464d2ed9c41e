"""Why a worker died by a signal: the kernel OOM killer, someone outside the job, or a native crash.

A worker killed by a signal left no exception to read, so the signal alone does not say whose fault
it was: a SIGKILL nobody in the job sent is usually the kernel's OOM killer or an operator, never
evidence of a bug in the training script. :func:`classify_kill` weighs the evidence a
:class:`KillEvidence` carries (kernel-log lines naming the PID, the memory cgroup's ``oom_kill``
count, the RSS last sampled, the rank's log tail) against the rules in ``kill_rules.yaml`` and
returns a :class:`KillVerdict`. Pure; the evidence is gathered by :mod:`.kill_witness`.
"""

from __future__ import annotations

import fnmatch
import re
import signal as _signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..terminal import shorten
from .incident import Component, FaultClass
from .rule_file import load_rule_file

__all__ = [
    "KillEvidence",
    "KillRule",
    "KillRules",
    "KillVerdict",
    "classify_kill",
    "load_kill_rules",
    "oom_lines_for",
    "signal_name",
]

# "Memory cgroup out of memory: Killed process 13606 (python3) total-vm:..., anon-rss:65280kB, ..."
# "Out of memory: Killed process 4242 (python) ..."; the older "Out of memory: Kill process 4242 ..."
_KILLED = re.compile(r"\b(?:Out of memory|out of memory)\b.*?\bKill(?:ed)? process (?P<pid>\d+)\b")
# "oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python3,pid=13606,uid=0"
_OOM_KILL = re.compile(r"\boom-kill:.*\bpid=(?P<pid>\d+)\b")
_ANON_RSS = re.compile(r"\banon-rss:(?P<kb>\d+)kB")


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def oom_lines_for(pid: int, kernel_log: Iterable[str]) -> tuple[str, ...]:
    """The kernel-log lines in which the OOM killer names ``pid``."""
    out = []
    for line in kernel_log:
        m = _KILLED.search(line) or _OOM_KILL.search(line)
        if m and int(m.group("pid")) == pid:
            out.append(line.strip())
    return tuple(out)


@dataclass(frozen=True)
class KillEvidence:
    """What is known about one worker's death by a signal."""

    rank: int
    pid: int
    signum: int
    oom_lines: tuple[str, ...] = ()  # kernel-log lines naming the PID (see :func:`oom_lines_for`)
    cgroup_oom_kills: int = 0  # rise of the memory cgroup's oom_kill count during the attempt
    rss_kb: int = -1  # the rank's resident memory at the last sample; -1 unknown
    log_tail: tuple[str, ...] = ()  # the last lines of the rank's log
    injected: str = ""  # the chaos plan entry that killed it on purpose ("" when none did)

    @property
    def oom(self) -> bool:
        return bool(self.oom_lines) or self.cgroup_oom_kills > 0

    def rss_text(self) -> str:
        kb = self.rss_kb
        if kb < 0:  # the kernel's own line says what the process held when it was killed
            m = next((_ANON_RSS.search(x) for x in self.oom_lines if _ANON_RSS.search(x)), None)
            kb = int(m.group("kb")) if m else -1
        return f"{kb / 1024:,.0f} MiB" if kb >= 0 else "not sampled"


class KillRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    signals: tuple[str, ...] = Field(min_length=1)
    oom: bool | None = None
    injected: bool | None = None  # true: only a death the chaos plan caused; false: only one it did not
    what: str
    fault_class: FaultClass
    component: Component  # also the accounting's class of the interruption (policy/vocabulary.py)
    confidence: float = Field(ge=0.0, le=1.0)
    action: str

    def holds(self, ev: KillEvidence) -> bool:
        name = signal_name(ev.signum)
        if not any(fnmatch.fnmatchcase(name, s) for s in self.signals):
            return False
        if self.injected is not None and self.injected != bool(ev.injected):
            return False
        return self.oom is None or self.oom == ev.oom


class KillRules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rules: tuple[KillRule, ...] = Field(min_length=1)


@dataclass(frozen=True)
class KillVerdict:
    rule: str
    what: str  # "killed by the kernel OOM killer (RSS ...)": the failure's evidence
    cause: str  # "rank N <what>": the incident's cause
    fault_class: FaultClass
    component: Component
    confidence: float
    action: str
    evidence: tuple[str, ...]


def load_kill_rules(path: str | Path | None = None) -> KillRules:
    """The shipped rules, or a site's own YAML file in the same format."""
    return load_rule_file(KillRules, "kill_rules.yaml", "kill rules", path)


class _Fmt(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def classify_kill(ev: KillEvidence, rules: KillRules | None = None) -> KillVerdict | None:
    """The first rule that holds for ``ev``, filled in; None when no rule does."""
    table = rules or load_kill_rules()
    rule = next((r for r in table.rules if r.holds(ev)), None)
    if rule is None:
        return None
    name = signal_name(ev.signum)
    tail = shorten(" | ".join(x.strip() for x in ev.log_tail[-3:] if x.strip()), 300) or "(empty)"
    values = _Fmt(signal=name, rss=ev.rss_text(), tail=tail, injected=ev.injected)
    what = rule.what.format_map(values)
    evidence = [f"rank {ev.rank} (pid {ev.pid}) killed by {name}"]
    evidence += [f"kernel log: {shorten(x, 200)}" for x in ev.oom_lines]
    if ev.cgroup_oom_kills:
        evidence.append(f"memory cgroup: oom_kill rose by {ev.cgroup_oom_kills} during the attempt")
    if ev.injected:
        evidence.append(f"the chaos plan's {ev.injected} fired in this process just before it died")
    if rule.oom is False:
        evidence.append("no OOM-killer line names the pid; the memory cgroup's oom_kill count did not rise")
    return KillVerdict(
        rule=rule.name,
        what=what,
        cause=f"rank {ev.rank} {what}",
        fault_class=rule.fault_class,
        component=rule.component,
        confidence=rule.confidence,
        action=rule.action,
        evidence=tuple(evidence),
    )
