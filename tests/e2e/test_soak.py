"""A short soak in the suite: fixed plans covering more than ten fault kinds, inside and outside the
tool, each run chained through requeues and checked against a clean run (bench/soak.py is the
long, randomized form)."""

from __future__ import annotations

import pytest

from stalwart.chaos.soak import PlannedFault, Soak, SoakConfig, summarize

from .runner import integrity_findings

pytestmark = pytest.mark.e2e

PLANS = {
    "crash-then-bad-manifest": (
        PlannedFault("crash", 6, 1),
        PlannedFault("sigterm-requeue", 14),
        PlannedFault("corrupt-manifest", 0),
    ),
    "full-disk-in-emergency-save": (
        PlannedFault("full-disk-emergency", 10),
        PlannedFault("delete-ckpt-file", 0),
    ),
    "agent-lost-and-stopped-worker": (
        PlannedFault("sigstop-worker", 7, 1),
        PlannedFault("sigkill-agent", 15),
        PlannedFault("truncate-ckpt-file", 0),
        PlannedFault("corrupt-ledger", 0),
    ),
    # a rank hung when the stop request comes: the emergency save cannot finish, so no exit 76
    "stop-request-while-a-rank-hangs": (PlannedFault("sigterm-requeue", 12), PlannedFault("hang", 13, 1)),
    "full-disk-at-the-end": (
        PlannedFault("kill-agent", 9),
        PlannedFault("sigkill-worker", 13, 0),
        PlannedFault("full-disk-end", 19),
    ),
}


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    return Soak(SoakConfig(workdir=tmp_path_factory.mktemp("soak")), log=lambda s: None)


@pytest.fixture(scope="module")
def results(soak):
    ref = soak.reference()
    return {name: soak.run_one(i, plan, ref) for i, (name, plan) in enumerate(PLANS.items())}


@pytest.mark.parametrize("name", list(PLANS))
def test_soak_run_is_truthful_and_loses_nothing(results, name):
    r = results[name]
    assert not r.false_verdicts, r.false_verdicts
    assert not r.wrong_resumes, r.wrong_resumes
    assert not r.lost_versions, r.lost_versions
    assert r.tool_hangs == 0, r.notes
    assert r.exit_codes and r.exit_codes[-1] in (0, 75), r.exit_codes
    if r.exit_codes[-1] == 0:
        assert r.bit_identical, r.notes


def test_soak_covers_ten_kinds_and_the_summary_counts_them(results, soak):
    # none of its faults corrupts state: a finding of silent corruption would be a false one
    assert not integrity_findings(soak.cfg.workdir), integrity_findings(soak.cfg.workdir)
    s = summarize(list(results.values()))
    assert len(s.faults) >= 10, s.faults
    assert s.runs == len(PLANS) and s.clean, s.details
