"""What a check says about one subject (a GPU, a link, a mount, the node)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    """How bad a finding is, as seen by the check that made it (the rule table has the last word)."""

    OK = 0
    INFO = 1
    WARN = 2
    FAIL = 3

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            from ..errors import ConfigError

            raise ConfigError(
                f"unknown severity {text!r}", f"use one of {', '.join(s.name.lower() for s in cls)}"
            ) from None


@dataclass(frozen=True)
class Finding:
    """One observation judged by a check.

    ``code`` is a dotted name the rule table matches on (``gpu.xid``, ``gpu.remap.pending``,
    ``ib.state``, ``telemetry.bad``); ``subject`` names the thing (``gpu0``, ``mlx5_0/1``, ``/data``);
    ``evidence`` holds the raw values that led to it.
    """

    check: str
    code: str
    subject: str
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "code": self.code,
            "subject": self.subject,
            "severity": self.severity.name.lower(),
            "message": self.message,
            "evidence": dict(self.evidence),
        }


def worst(findings: list[Finding] | tuple[Finding, ...]) -> Severity:
    return max((f.severity for f in findings), default=Severity.OK)
