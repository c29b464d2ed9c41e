"""``stalwart demo``'s chaos plan at every worker count it allows: every fault fires (no rank that
does not exist), and the crashes stay off the slowed rank while it is slowed."""

from __future__ import annotations

import pytest

from stalwart.chaos.plan import FaultKind, build_plan
from stalwart.commands.demo import DEMO_PLAN, PLAN_WORKERS, demo_faults, intro_lines


@pytest.mark.parametrize("workers", range(2, 9))
def test_every_fault_fires_at_every_worker_count(workers):
    faults, _ = demo_faults(workers)
    plan = build_plan(faults)
    assert len(plan.faults) == len(DEMO_PLAN)
    plan.check_world(workers, 1)  # raises for a rank the job does not have
    slow = next(f for f in plan.faults if f.kind is FaultKind.SLOW)
    for f in plan.faults:
        if f.kind in (FaultKind.CRASH, FaultKind.HANG) and f.rank == slow.rank:
            assert f.step is not None and slow.stop is not None
            assert not slow.start <= f.step <= slow.stop, f"{f.describe()} strikes the slowed rank"


def test_the_4_worker_plan_is_the_written_one_and_says_nothing_more():
    faults, note = demo_faults(PLAN_WORKERS)
    assert faults == [
        "slow@rank=3,factor=1.6,from=30,to=70",
        "crash@rank=1,step=35",
        "hang@rank=2,step=75",
        "crash@rank=3,step=110",
        "corrupt-checkpoint@step=146",
        "crash@rank=0,step=150",
    ]
    assert note == ""


def test_two_workers_keep_the_hang_and_say_how_the_plan_was_folded():
    faults, note = demo_faults(2)
    assert "hang@rank=0,step=75" in faults  # the filter used to drop the hang aimed at rank 2
    assert faults[:2] == ["slow@rank=1,factor=1.6,from=30,to=70", "crash@rank=0,step=35"]
    assert "taken modulo 2" in note and "step 35 goes to the next rank" in note
    intro = "\n".join(intro_lines(2, faults, note))
    assert note in intro and "hang@rank=0,step=75" in intro


def test_the_intro_says_what_recovery_does_now():
    intro = " ".join(intro_lines(4, *demo_faults(4)))
    assert "replaced in place" in intro and "live state" in intro
    assert "Background verification finds the corrupted checkpoint" in intro
    assert "restarts from the newest good checkpoint," not in intro
    # a hang is replaced in place too, once the stacks tell the hung rank (test_in_place.py)
    assert "hung rank is told from the ranks waiting for it by their stacks" in intro
    assert "A hang restarts the workers" not in intro
