"""What a check says about one subject (a GPU, a link, a mount, the node)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import assert_never

from ..errors import ConfigError
from ..policy.label import Label


class CheckStatus(Label):
    """What a check (or the rule table over its findings) concludes for a node: a pass, a warning,
    a failure. The values are written to ledgers and rule tables; they never change."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        """0 for a pass, 2 for a failure: the worst of several is the one of highest rank."""
        match self:
            case CheckStatus.PASS:
                return 0
            case CheckStatus.WARN:
                return 1
            case CheckStatus.FAIL:
                return 2
            case _:
                assert_never(self)


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
    evidence: dict[str, Any] = field(default_factory=dict)  # Any: evidence is JSON of any shape (json.dumps)

    def to_json(self) -> dict[str, Any]:  # Any: JSON of any shape (json.dumps)
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
