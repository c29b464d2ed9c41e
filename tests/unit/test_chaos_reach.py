"""Which faults an unchanged script can take, the refusal's message, and the never-fired accounting."""

from __future__ import annotations

import pytest

from stalwart.chaos.plan import FaultKind, build_plan
from stalwart.chaos.reach import Fired, hook_fires, needs_sdk, sdk_refusal, spec_of, unfired, unfired_line


@pytest.mark.parametrize(
    ("kind", "fires"),
    [
        (FaultKind.CRASH, True),
        (FaultKind.EXIT, True),
        (FaultKind.RAISE, True),
        (FaultKind.HANG, True),
        (FaultKind.SLOW, True),
        (FaultKind.KILL_AGENT, True),
        (FaultKind.CORRUPT_CHECKPOINT, False),
        (FaultKind.TRUNCATE_CHECKPOINT, False),
    ],
)
def test_an_unchanged_script_takes_every_step_fault_and_no_checkpoint_damage(kind, fires):
    assert hook_fires(kind) is fires


def test_needs_sdk_lists_only_the_checkpoint_damage_of_a_plan():
    plan = build_plan(["crash@rank=1,step=5", "corrupt-checkpoint@step=5", "truncate-checkpoint@step=9"])
    assert [f.kind for f in needs_sdk(plan)] == [
        FaultKind.CORRUPT_CHECKPOINT,
        FaultKind.TRUNCATE_CHECKPOINT,
    ]
    assert needs_sdk(build_plan(["crash@rank=1,step=5", "slow@rank=0,factor=2"])) == ()


def test_the_refusal_names_the_fault_as_written_the_rank_and_what_to_do():
    plan = build_plan(["corrupt-checkpoint@step=5"])
    err = sdk_refusal(needs_sdk(plan), rank=0)
    text = str(err)
    assert "fault 'corrupt-checkpoint@step=5' needs the Stalwart SDK (Session)" in text
    assert "rank 0 steps without one" in text
    assert "drop the fault" in text and "stalwart.Session" in text
    assert err.exit_code == 2


def test_the_refusal_of_two_faults_names_both():
    plan = build_plan(["corrupt-checkpoint@step=5", "truncate-checkpoint@step=7,on=failure"])
    text = str(sdk_refusal(needs_sdk(plan), rank=3))
    assert "faults 'corrupt-checkpoint@step=5', 'truncate-checkpoint@step=7,on=failure' need " in text


def test_spec_of_a_slow_fault_keeps_its_factor():
    assert spec_of(build_plan(["slow@rank=2,factor=1.5"]).faults[0]) == "slow@rank=2,factor=1.5"


def test_a_fault_on_record_fired_and_one_past_the_last_step_did_not():
    plan = build_plan(["crash@rank=1,step=5", "crash@rank=0,step=500"])
    missing = unfired(plan, [Fired("crash", 1, 5)])
    assert [spec_of(f) for f in missing] == ["crash@rank=0,step=500"]


def test_a_record_on_another_rank_or_step_does_not_count():
    plan = build_plan(["hang@rank=1,step=5"])
    assert unfired(plan, [Fired("hang", 0, 5), Fired("hang", 1, 6), Fired("crash", 1, 5)]) == plan.faults


def test_one_record_accounts_for_one_fault_only():
    plan = build_plan(["crash@rank=1,step=5,id=a", "crash@rank=1,step=5,id=b"])
    assert [f.ident for f in unfired(plan, [Fired("crash", 1, 5)])] == ["b"]


def test_a_raise_at_every_attempt_counts_once_for_its_fault():
    plan = build_plan(["raise@rank=0,step=3"])
    assert unfired(plan, [Fired("raise", 0, 3), Fired("raise", 0, 3)]) == ()


def test_slow_counts_when_announced_anywhere_in_its_span_and_agent_faults_by_step():
    plan = build_plan(["slow@rank=2,factor=2,from=10,to=20", "kill-agent@node=0,step=8"])
    assert unfired(plan, [Fired("slow", 2, 12), Fired("kill-agent", -1, 8)]) == ()
    assert unfired(plan, [Fired("slow", 2, 21)]) == plan.faults


def test_the_never_fired_line_names_each_fault_and_the_last_step():
    plan = build_plan(["crash@rank=0,step=500"])
    line = unfired_line(plan.faults, last_step=19)
    assert line.startswith("chaos: 1 planned fault(s) never fired: 'crash@rank=0,step=500'")
    assert "the run's last step was 19" in line
    assert unfired_line((), 19) == ""
    assert "completed no step" in unfired_line(plan.faults, -1)
