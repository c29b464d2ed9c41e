"""The rule table: shipped data, site overrides, and errors for bad tables."""

from __future__ import annotations

import pytest

from stalwart.errors import ConfigError
from stalwart.health.findings import Finding, Severity
from stalwart.health.rules import load_rules


def xid(n: int, subject: str = "gpu0") -> Finding:
    return Finding("kernel_log", "gpu.xid", subject, Severity.FAIL, f"Xid {n}", {"xid": n})


@pytest.mark.parametrize(
    "n,status,action,recoverable",
    [
        (13, "pass", "none", True),  # application fault: no node action
        (31, "pass", "none", True),
        (92, "warn", "watch", True),
        (48, "fail", "drain_reset_gpu", True),
        (63, "fail", "drain_reset_gpu", True),
        (119, "fail", "drain_reset_gpu", True),
        (64, "fail", "drain_power_cycle", False),
        (79, "fail", "drain_power_cycle", False),
        (9999, "warn", "watch", True),  # unknown Xid: watch, never silently pass
    ],
)
def test_shipped_xid_classes(n, status, action, recoverable):
    v = load_rules().evaluate([xid(n)])
    assert (v.status, v.action, v.recoverable) == (status, action, recoverable)
    assert str(n) in v.reason


def test_irrecoverable_wins_the_action_and_the_class():
    v = load_rules().evaluate([xid(48, "gpu1"), xid(79, "gpu3"), xid(13)])
    assert v.status == "fail" and v.action == "drain_power_cycle" and not v.recoverable
    assert "gpu3" in v.reason and "(+1 more)" in v.reason
    assert v.fault_key() == "xid-irrecoverable,xid-reset"


def test_site_table_can_move_an_xid_between_lists(tmp_path):
    table = tmp_path / "rules.yaml"
    table.write_text("""
xid_lists: {ignore: [79]}
rules:
  - {code: gpu.xid, xid_in: ignore, verdict: pass, action: none}
  - {code: "*", severity: fail, verdict: fail, action: drain}
""")
    rules = load_rules(table)
    assert rules.evaluate([xid(79)]).status == "pass"
    assert rules.evaluate([xid(48)]).action == "drain"


def test_no_findings_pass():
    v = load_rules().evaluate([])
    assert v.status == "pass" and v.reason == "pass: no findings"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("rules: 3", "'rules' list"),
        ("rules: [{code: a, verdict: maybe, action: x}]", "verdict 'maybe'"),
        ("rules: [{code: a, verdict: fail}]", "lacks action"),
        ("rules: [{code: a, verdict: fail, action: x, xid_in: nope}]", "unknown xid list 'nope'"),
        ("xid_lists: {a: [x]}\nrules: []", "list of integers"),
        ("rules: [{code: a, verdict: fail, action: x, severity: awful}]", "unknown severity"),
        ("rules: [: :", "not valid YAML"),
    ],
)
def test_bad_tables_are_config_errors(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_rules(p)
    assert needle in str(e.value)


def test_missing_table_file(tmp_path):
    with pytest.raises(ConfigError, match="rule table .* does not exist"):
        load_rules(tmp_path / "absent.yaml")
