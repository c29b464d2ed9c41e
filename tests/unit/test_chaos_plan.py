"""Fault plans: flag and YAML parsing, validation errors, fire-once markers."""

from __future__ import annotations

import pytest

from stalwart.chaos.once import claim
from stalwart.chaos.plan import (
    Fault,
    FaultKind,
    FaultPlan,
    build_plan,
    load_plan_file,
    parse_spec,
    split_specs,
)
from stalwart.errors import FaultPlanError


def test_parse_every_kind():
    assert parse_spec("crash@rank=1,step=40") == Fault("crash", rank=1, step=40)
    assert parse_spec(" exit@rank=0, step=3 ") == Fault("exit", rank=0, step=3)
    assert parse_spec("raise@rank=0,step=30") == Fault("raise", rank=0, step=30)
    assert parse_spec("hang@rank=2,step=60") == Fault("hang", rank=2, step=60)
    assert parse_spec("slow@rank=3,factor=1.5,from=10,to=20") == Fault(
        "slow", rank=3, factor=1.5, start=10, stop=20
    )
    assert parse_spec("kill_agent@node=1,step=50") == Fault("kill-agent", step=50, node=1)
    assert parse_spec("CORRUPT-CHECKPOINT@step=70").kind == "corrupt-checkpoint"
    assert parse_spec("truncate-checkpoint@step=70,id=t1").marker() == "t1"


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("", "empty fault spec"),
        ("explode@rank=1,step=2", "unknown fault 'explode'"),
        ("crash@step=4", "needs rank="),
        ("crash@rank=1", "needs step="),
        ("crash@rank=one,step=4", "rank='one' is not an integer"),
        ("crash@rank=-1,step=4", "rank=-1 must be >= 0"),
        ("crash@rank=1,step=4,color=red", "unknown key(s) color"),
        ("crash@rank=1,step", "'step' is not key=value"),
        ("kill-agent@step=5", "needs node="),
        ("slow@rank=1,factor=1.0", "factor=1 must be in (1, 100]"),
        ("slow@rank=1,factor=fast", "factor='fast' is not a number"),
        ("slow@rank=1,factor=2,from=10,to=5", "to=5 is before from=10"),
        ("hang@rank=1,step=4,at=0.5", "takes no at="),
        ("crash@rank=1,step=4,at=1", "at=1 must be in [0, 1)"),
        ("crash@rank=1,step=4,at=soon", "at='soon' is not a number"),
        ("crash@rank=1,step=4,at=nan", "at=nan is not a number"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, fragment):
    with pytest.raises(FaultPlanError) as exc:
        parse_spec(spec)
    assert fragment in exc.value.message


def test_unknown_kind_hint_lists_the_kinds():
    with pytest.raises(FaultPlanError) as exc:
        parse_spec("boom@rank=1,step=1")
    assert "crash" in exc.value.hint and "kill-agent" in exc.value.hint


def test_split_and_build_plan_rejects_duplicates():
    assert split_specs(["crash@rank=1,step=4;hang@rank=0,step=9", "exit@rank=0,step=2;"]) == [
        "crash@rank=1,step=4",
        "hang@rank=0,step=9",
        "exit@rank=0,step=2",
    ]
    plan = build_plan(["crash@rank=1,step=4;hang@rank=0,step=9"])
    assert [f.kind for f in plan.faults] == ["crash", "hang"]
    with pytest.raises(FaultPlanError, match="same fault twice"):
        build_plan(["crash@rank=1,step=4", "crash@rank=1,step=4"])
    assert len(build_plan(["crash@rank=1,step=4,id=a", "crash@rank=1,step=4,id=b"]).faults) == 2


def test_yaml_plans(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text("faults:\n  - {fault: crash, rank: 1, step: 40}\n  - {fault: slow, rank: 3, factor: 1.5}\n")
    plan = load_plan_file(p)
    assert plan.faults == (Fault("crash", rank=1, step=40), Fault("slow", rank=3, factor=1.5))
    p.write_text("- fault: kill-agent\n  node: 1\n  step: 5\n")
    assert load_plan_file(p).faults == (Fault("kill-agent", node=1, step=5),)
    # file plan and flags combine
    assert len(build_plan(["hang@rank=0,step=9"], p).faults) == 2


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("faults: {fault: crash}", "must be a list of faults"),
        ("- {rank: 1, step: 2}", "entry 0 needs a 'fault:' key"),
        ("- [1, 2]", "entry 0 needs a 'fault:' key"),
        ("- {fault: crash, rank: 1, step: 2, speed: 3}", "unknown key(s) speed"),
        ("faults: [\n  - {", "is not valid YAML"),
    ],
)
def test_bad_yaml_plans(tmp_path, text, fragment):
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    with pytest.raises(FaultPlanError) as exc:
        load_plan_file(p)
    assert fragment in exc.value.message


def test_missing_plan_file(tmp_path):
    with pytest.raises(FaultPlanError, match="does not exist"):
        load_plan_file(tmp_path / "nope.yaml")


def test_routing_and_json_round_trip():
    plan = build_plan(
        [
            "crash@rank=1,step=4;slow@rank=1,factor=2;hang@rank=0,step=9;"
            "kill-agent@node=1,step=3;corrupt-checkpoint@step=5"
        ]
    )
    assert [f.kind for f in plan.for_rank(1)] == ["crash", "slow"]
    assert [f.kind for f in plan.for_rank(0)] == ["hang"]
    assert plan.for_rank(2) == ()
    assert [f.kind for f in plan.agent_faults()] == ["kill-agent", "corrupt-checkpoint"]
    assert FaultPlan.from_json(plan.to_json()) == plan
    assert plan.describe()[1] == "slow rank 1 x2 (from step 0)"
    assert plan.describe()[0] == "crash at rank 1, step 4"


def test_faults_fire_once_except_raise_and_slow(tmp_path):
    crash = Fault("crash", rank=1, step=4)
    assert claim(tmp_path / "chaos", crash) is True
    assert claim(tmp_path / "chaos", crash) is False  # a restarted worker does not crash again
    assert claim(tmp_path / "chaos", Fault("crash", rank=1, step=5)) is True
    bug = Fault("raise", rank=0, step=3)
    assert not bug.once and claim(tmp_path / "chaos", bug) and claim(tmp_path / "chaos", bug)
    assert not Fault("slow", rank=0, factor=2).once


def test_a_kind_is_an_enum_that_still_reads_and_writes_as_its_name(tmp_path):
    fault = parse_spec("kill-agent@node=1,step=50")
    assert fault.kind is FaultKind.KILL_AGENT and fault.kind == "kill-agent"
    assert f"{fault.kind}" == "kill-agent" and fault.marker() == "kill-agent-rNone-s50-n1"
    assert Fault("kill-agent", node=1, step=50) == fault  # built from the name, as the JSON plan does
    assert '"kind": "kill-agent"' in FaultPlan((fault,)).to_json()
    # worker faults need a rank and fire in the worker; the agent's fire in the agent
    assert {k for k in FaultKind if k.in_worker} == {"crash", "exit", "raise", "hang", "slow", "bitflip"}
    assert {k for k in FaultKind if not k.once} == {FaultKind.RAISE, FaultKind.SLOW}
    with pytest.raises(ValueError):
        Fault("explode")
    assert claim(tmp_path, fault) and (tmp_path / "fired-kill-agent-rNone-s50-n1").exists()


def test_a_bitflip_names_its_target_and_bit_and_refuses_what_it_cannot_do():
    f = parse_spec("bitflip@rank=1,step=30")
    assert (f.kind, f.rank, f.step, f.target, f.bit) == (FaultKind.BITFLIP, 1, 30, "param", -1)
    assert f.once and "param, bit lowest exponent" in f.describe()
    g = parse_spec("bitflip@rank=2,step=5,target=grad,bit=30")
    assert (g.target, g.bit) == ("grad", 30) and "grad, bit 30" in g.describe()
    assert FaultPlan.from_json(FaultPlan((g,)).to_json()).faults == (g,)
    for bad in ("bitflip@rank=1,step=3,target=disk", "bitflip@rank=1,step=3,bit=64", "bitflip@step=3"):
        with pytest.raises(FaultPlanError):
            parse_spec(bad)
    with pytest.raises(FaultPlanError, match="only bitflip"):
        parse_spec("crash@rank=1,step=3,bit=2")
