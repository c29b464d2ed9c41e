"""The rule table: findings -> one verdict with an action and a reason. Data lives in ``rules.yaml``."""

from __future__ import annotations

import fnmatch
import functools
import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from typing_extensions import assert_never

from ..errors import ConfigError
from ..inputs import parse_yaml, read_text_file
from .findings import CheckStatus, Finding, Severity

STATUSES = tuple(s.value for s in CheckStatus)  # ("pass", "warn", "fail"), mildest first
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster


@dataclass(frozen=True)
class Rule:
    name: str
    code: str
    verdict: CheckStatus
    action: str
    recoverable: bool
    reason: str
    severity: Severity | None = None
    xid_in: str | None = None

    def matches(self, f: Finding, xid_lists: dict[str, frozenset[int]]) -> bool:
        if not fnmatch.fnmatchcase(f.code, self.code):
            return False
        if self.severity is not None and f.severity < self.severity:
            return False
        if self.xid_in is not None:
            return f.evidence.get("xid") in xid_lists[self.xid_in]
        return True


@dataclass(frozen=True)
class Decision:
    """What the table decided for one finding."""

    finding: Finding
    rule: str
    status: CheckStatus
    action: str
    recoverable: bool
    reason: str


@dataclass(frozen=True)
class Verdict:
    status: CheckStatus
    action: str
    recoverable: bool
    reason: str
    decisions: tuple[Decision, ...] = ()

    @property
    def failing(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.status is CheckStatus.FAIL)

    def fault_key(self) -> str:
        """A stable family name for the failing decisions (used to spot recurrences)."""
        return ",".join(sorted({d.rule for d in self.failing}))


class _Fmt(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


@dataclass(frozen=True)
class RuleTable:
    rules: tuple[Rule, ...]
    xid_lists: dict[str, frozenset[int]]

    def decide(self, f: Finding) -> Decision:
        for r in self.rules:
            if r.matches(f, self.xid_lists):
                try:
                    text = r.reason.format_map(
                        _Fmt({**f.evidence, "subject": f.subject, "message": f.message})
                    )
                except (ValueError, TypeError, KeyError, IndexError, AttributeError):
                    # a spec that does not fit this finding's values (e.g. {xid:d} on text): say it plainly
                    text = f"{f.subject}: {f.message}"
                return Decision(f, r.name, r.verdict, r.action, r.recoverable, text)
        return Decision(f, "(none)", CheckStatus.PASS, "none", True, f.message)

    def evaluate(self, findings: list[Finding] | tuple[Finding, ...]) -> Verdict:
        decisions = tuple(self.decide(f) for f in findings)
        if not decisions:
            return Verdict(CheckStatus.PASS, "none", True, "pass: no findings", ())
        status = max((d.status for d in decisions), key=lambda s: s.rank)
        top = [d for d in decisions if d.status is status]
        # irrecoverable first: it decides the action
        top.sort(key=lambda d: d.recoverable)
        recoverable = all(d.recoverable for d in decisions if d.status is CheckStatus.FAIL)
        first = top[0]
        more = f" (+{len(top) - 1} more)" if len(top) > 1 else ""
        match status:
            case CheckStatus.PASS:
                reason = "pass: " + (
                    "; ".join(d.reason for d in decisions if d.finding.severity >= Severity.INFO)
                    or "no faults"
                )
                return Verdict(status, "none", recoverable, reason, decisions)
            case CheckStatus.WARN:
                reason = f"warn: {first.reason}{more} -> {first.action}"
            case CheckStatus.FAIL:
                cls = " [recoverable]" if recoverable else " [irrecoverable]"
                reason = f"fail: {first.reason}{more} -> {first.action}{cls}"
            case _:
                assert_never(status)
        return Verdict(status, first.action, recoverable, reason, decisions)


MAX_RULES = 1000
MAX_RULES_BYTES = 1 << 20
MAX_SPEC = 16  # characters of one format spec in a reason template, e.g. ".1f" or ">8"
MAX_WIDTH = 200


def check_template(template: str, where: str) -> str:
    """A reason template may use ``{name}`` fields (evidence keys, subject, message) and short specs only.

    Refused: positional ``{0}``/``{}``, attribute or index access (``{x.y}``, ``{x[0]}``), conversions
    other than !r/!s/!a, nested fields in a spec, widths above :data:`MAX_WIDTH`, unbalanced braces.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"{where}: reason template {template[:60]!r} is malformed ({exc})") from None
    for _literal, field, spec, conv in parts:
        if field is None:
            continue
        if not field.isidentifier():
            raise ConfigError(
                f"{where}: reason field {{{field[:40]}}} is not a plain name",
                "use named fields like {subject}, {message} or an evidence key",
            )
        if conv not in (None, "r", "s", "a"):
            raise ConfigError(f"{where}: reason field {{{field}!{conv}}} has an unknown conversion")
        if spec and (len(spec) > MAX_SPEC or "{" in spec):
            raise ConfigError(f"{where}: reason field {{{field}}} has a format spec that is too long")
        widths = [int(w) for w in re.findall(r"\d+", spec or "")]
        if any(w > MAX_WIDTH for w in widths):
            raise ConfigError(f"{where}: reason field {{{field}}} asks for a width over {MAX_WIDTH}")
    return template


def _text(value: object, what: str, origin: str, i: int) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"{origin}: rule #{i + 1}: {what} must be text, got {type(value).__name__}")
    return str(value)


def _parse(data: Any, origin: str) -> RuleTable:  # Any: yaml.safe_load returns untyped data; validated here
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ConfigError(
            f"{origin}: a rule table needs a top-level 'rules' list",
            "see src/stalwart/health/rules.yaml for the format",
        )
    if len(data["rules"]) > MAX_RULES:
        raise ConfigError(f"{origin}: {len(data['rules'])} rules (at most {MAX_RULES})")
    lists: dict[str, frozenset[int]] = {}
    xid_lists = data.get("xid_lists") or {}
    if not isinstance(xid_lists, dict):
        raise ConfigError(f"{origin}: xid_lists must be a mapping of name -> list of integers")
    for name, values in xid_lists.items():
        if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
            raise ConfigError(f"{origin}: xid list {name!r} must be a list of integers")
        lists[str(name)] = frozenset(values)
    rules = []
    for i, raw in enumerate(data["rules"]):
        if not isinstance(raw, dict):
            raise ConfigError(f"{origin}: rule #{i + 1} is not a mapping")
        missing = {"code", "verdict", "action"} - set(raw)
        if missing:
            raise ConfigError(f"{origin}: rule #{i + 1} lacks {', '.join(sorted(missing))}")
        if not isinstance(raw["verdict"], str) or raw["verdict"] not in STATUSES:
            raise ConfigError(
                f"{origin}: rule #{i + 1} has verdict {raw['verdict']!r}", "use pass, warn or fail"
            )
        xid_in = raw.get("xid_in")
        if xid_in is not None and not isinstance(xid_in, str):
            raise ConfigError(f"{origin}: rule #{i + 1}: xid_in must be the name of an xid list")
        if raw.get("severity") is not None and not isinstance(raw["severity"], str):
            raise ConfigError(f"{origin}: rule #{i + 1}: severity must be text (info, warning, ...)")
        if xid_in is not None and xid_in not in lists:
            raise ConfigError(
                f"{origin}: rule #{i + 1} refers to unknown xid list {xid_in!r}",
                f"define it under xid_lists (known: {', '.join(sorted(lists)) or 'none'})",
            )
        rules.append(
            Rule(
                name=_text(raw.get("name", f"rule{i + 1}"), "name", origin, i),
                code=_text(raw["code"], "code", origin, i),
                verdict=CheckStatus(raw["verdict"]),
                action=_text(raw["action"], "action", origin, i),
                recoverable=bool(raw.get("recoverable", True)),
                reason=check_template(
                    _text(raw.get("reason", "{subject}: {message}"), "reason", origin, i),
                    f"{origin}: rule #{i + 1}",
                ),
                severity=Severity.parse(raw["severity"]) if raw.get("severity") else None,
                xid_in=xid_in,
            )
        )
    return RuleTable(tuple(rules), lists)


@functools.lru_cache(maxsize=1)
def _shipped() -> RuleTable:
    text = resources.files("stalwart.health").joinpath("rules.yaml").read_text()
    return _parse(yaml.load(text, Loader=_Loader), "rules.yaml (shipped)")


def load_rules(path: str | Path | None = None) -> RuleTable:
    """The shipped table (parsed once per process), or a site's own YAML file."""
    if path is None:
        return _shipped()
    text = read_text_file(path, MAX_RULES_BYTES, "rule table")
    return _parse(parse_yaml(text, f"rule table {path}"), str(path))
