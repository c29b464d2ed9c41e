"""Background checkpoint verification's decisions (policy/checkpoint_scrub.py): which version is read
next and when, within the time budget, and what a reading means."""

from __future__ import annotations

import pytest

from stalwart.policy.checkpoint_scrub import (
    Budget,
    Identity,
    Reading,
    ScrubAction,
    ScrubStep,
    ScrubVerdict,
    Version,
    fallback_line,
    judge,
    next_verification,
    recovery_order,
    rest_until,
)

B = Budget(duty=0.1, recheck_s=5.0)
ID = Identity(dir_inode=10, manifest_inode=11, manifest_mtime_ns=12, manifest_size=13)


def mem(step: int, at: float = 0.0) -> Version:
    return Version("memory", 0, step, at)


def disk(step: int, at: float = 0.0) -> Version:
    return Version("local", 1, step, at)


def test_recovery_order_is_newest_step_first_then_fastest_tier():
    order = recovery_order([disk(10), mem(20), disk(20), mem(10)])
    assert [(v.tier, v.step) for v in order] == [("memory", 20), ("local", 20), ("memory", 10), ("local", 10)]


def test_a_version_just_committed_is_not_read_at_once():
    # its persist hashed the files it had just written: reading them now would check the same bytes
    d = next_verification([disk(20, at=99.0)], now=100.0, rested_at=0.0, budget=B)
    assert d.action is ScrubAction.WAIT and d.until == pytest.approx(104.0)
    assert "known good within the last 5s" in d.reason


def test_versions_due_are_read_in_recovery_order():
    vs = [disk(10, at=90.0), disk(20, at=94.0), mem(20, at=99.0)]
    d = next_verification(vs, now=100.0, rested_at=0.0, budget=B)
    assert d.action is ScrubAction.VERIFY and d.version == disk(20, at=94.0)  # mem(20): known good 1 s ago
    assert "local step 20 known good 6.0s ago, due" == d.reason


def test_nothing_due_waits_for_the_first_to_come_due():
    d = next_verification([disk(10, at=98.0), mem(10, at=97.0)], now=100.0, rested_at=0.0, budget=B)
    assert d.action is ScrubAction.WAIT and d.until == pytest.approx(102.0)


def test_no_version_waits_one_recheck():
    d = next_verification([], now=100.0, rested_at=0.0, budget=B)
    assert d.action is ScrubAction.WAIT and d.until == pytest.approx(105.0)


def test_the_budget_rests_after_a_reading():
    # a reading that started at 10 s and used 0.5 s of CPU, at a 10% duty: the next starts at 15 s,
    # even with a version due
    rested = rest_until(10.0, 0.5, B.duty)
    assert rested == pytest.approx(15.0)
    d = next_verification([disk(10)], now=12.0, rested_at=rested, budget=B)
    assert d.action is ScrubAction.WAIT and d.until == pytest.approx(15.0)
    assert "at most 10% of one CPU" in d.reason
    assert next_verification([disk(10)], now=15.0, rested_at=rested, budget=B).action is ScrubAction.VERIFY


def test_cpu_spent_reading_is_the_duty_share_of_the_time_however_long_a_reading_waits():
    # a loaded node: each reading uses 0.3 s of CPU but takes 1.5 s of wall time, waiting for a CPU
    t, cpu = 0.0, 0.0
    while t < 1000.0:
        cpu += 0.3
        t = max(rest_until(t, 0.3, 0.02), t + 1.5)
    assert cpu / t == pytest.approx(0.02, rel=0.02)


@pytest.mark.parametrize("duty", [0.0, -0.1, 1.5])
def test_a_duty_outside_0_1_is_refused(duty):
    with pytest.raises(ValueError):
        Budget(duty=duty)


def test_a_clean_reading_keeps_the_version():
    out = judge(disk(20), Reading("", ID, ID))
    assert (out.verdict, out.step) == (ScrubVerdict.CLEAN, ScrubStep.KEEP)


def test_a_problem_in_the_same_version_is_damage():
    out = judge(disk(20), Reading("__0_0.distcp checksum (SHA-256) ab... != cd... (corrupted)", ID, ID))
    assert (out.verdict, out.step) == (ScrubVerdict.DAMAGED, ScrubStep.SET_ASIDE)
    assert out.reason == "local step 20: __0_0.distcp checksum (SHA-256) ab... != cd... (corrupted)"


def test_a_version_removed_while_read_has_no_verdict():
    # retention deleting it: its files went missing, then so did the directory
    out = judge(disk(20), Reading("missing file __0_0.distcp", ID, None))
    assert (out.verdict, out.step) == (ScrubVerdict.CHANGED, ScrubStep.FORGET)
    assert "removed while it was read" in out.reason


def test_a_version_saved_again_while_read_has_no_verdict():
    again = Identity(dir_inode=99, manifest_inode=98, manifest_mtime_ns=12, manifest_size=13)
    out = judge(disk(20), Reading("missing file rank-0.pt", ID, again))
    assert (out.verdict, out.step) == (ScrubVerdict.CHANGED, ScrubStep.FORGET)
    assert "replaced" in out.reason


def test_a_version_gone_before_the_reading_has_no_verdict():
    out = judge(disk(20), Reading("no manifest (save never committed)", None, None))
    assert out.verdict is ScrubVerdict.CHANGED


def test_the_fallback_line_says_what_a_recovery_reads_and_whether_it_was_just_verified():
    assert (
        fallback_line(disk(20), True)
        == "a recovery reads step 20 from the local tier instead, verified just now"
    )
    assert fallback_line(mem(10), False) == "a recovery reads step 10 from the memory tier instead"
    assert "would begin at step 0" in fallback_line(None, False)
