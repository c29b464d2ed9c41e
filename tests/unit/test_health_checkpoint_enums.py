"""The statuses and kinds of the health and checkpoint packages are str enums whose values are the
strings ledgers, state files and rule tables already hold; those strings must keep reading."""

from __future__ import annotations

import pytest

from stalwart.checkpoint.engine import CheckpointEngine, OnBusy
from stalwart.checkpoint.node_tier import RestoreSource
from stalwart.checkpoint.tiers import TierConfig, TierKind, validate_tiers
from stalwart.errors import ConfigError
from stalwart.events.node_health import NodeStateChanged
from stalwart.health.backends import BackendKind, LocalBackend, SlurmBackend, make_backend
from stalwart.health.findings import CheckStatus, Finding, Severity
from stalwart.health.lifecycle import (
    CheckOutcome,
    LifecyclePolicy,
    NodeAction,
    NodeRecord,
    NodeState,
    SchedulerView,
    transition,
)
from stalwart.health.node_controller import state_changed
from stalwart.health.node_store import HealthStore
from stalwart.health.rules import load_rules


def test_values_are_the_strings_already_written():
    assert [s.value for s in CheckStatus] == ["pass", "warn", "fail"]
    assert [a.value for a in NodeAction] == ["none", "drain", "resume", "alert"]
    assert [s.value for s in NodeState] == ["healthy", "suspect", "quarantined", "probation"]
    assert [k.value for k in TierKind] == ["memory", "local", "shared", "object"]
    assert [k.value for k in BackendKind] == ["local", "slurm"]
    assert [s.value for s in RestoreSource] == ["memory", "peer"]
    assert [b.value for b in OnBusy] == ["skip", "wait"]


def test_an_enum_reads_as_its_value_in_text():
    # reasons are built with f-strings: a member must read "fail", never "CheckStatus.FAIL"
    assert f"{CheckStatus.FAIL}: x" == "fail: x" and str(NodeAction.DRAIN) == "drain"
    assert f"{TierKind.OBJECT}/{RestoreSource.PEER}/{BackendKind.SLURM}" == "object/peer/slurm"


def test_an_outcome_given_the_old_strings_holds_the_enum():
    out = CheckOutcome("warn", "warn: PCIe replays")
    assert out.status is CheckStatus.WARN
    with pytest.raises(ValueError):
        CheckOutcome("broken", "a status no check decides")


def test_the_worst_status_of_a_verdict_follows_the_status_order():
    assert sorted(CheckStatus, key=lambda s: s.rank, reverse=True)[0] is CheckStatus.FAIL
    table = load_rules()
    warn = Finding("gpu", "telemetry.bad", "node", Severity.WARN, "unreadable")
    fail = Finding("gpu", "gpu.lost", "gpu0", Severity.FAIL, "lost")
    v = table.evaluate([warn, fail, warn])
    assert v.status is CheckStatus.FAIL and v.reason.startswith("fail: ")
    v = table.evaluate([warn])
    assert v.status is CheckStatus.WARN and v.reason.startswith("warn: ") and "[recoverable]" not in v.reason


@pytest.mark.parametrize("state", list(NodeState))
@pytest.mark.parametrize("status", list(CheckStatus))
@pytest.mark.parametrize("sched", [None, SchedulerView(False), SchedulerView(True, "stalwart: x")])
def test_every_status_in_every_state_has_a_transition(state, status, sched):
    rec = NodeRecord("n", state=state, reason="r", fault_key="k")
    t = transition(rec, CheckOutcome(status, "why", revalidation=True), sched, LifecyclePolicy(), now=5.0)
    assert isinstance(t.action, NodeAction) and isinstance(t.record.state, NodeState) and t.reason
    assert t.changed == (t.action is not NodeAction.NONE)


def test_a_ledger_state_change_reads_back_through_the_store(tmp_path):
    before = NodeRecord("n1")
    tr = transition(before, CheckOutcome("fail", "fail: Xid 79", False, "xid"), None, LifecyclePolicy(), 3.0)
    ev = state_changed("n1", before, tr, 3.0)
    assert (ev.from_state, ev.to_state, ev.action) == ("healthy", "quarantined", "drain")
    assert type(ev.action) is str and type(ev.to_state) is str
    store = HealthStore(tmp_path)
    store.append("n1", [ev])
    got = store.records()["n1"]
    assert got.state is NodeState.QUARANTINED and got.needs_human and got.fault_key == "xid"


def test_an_old_ledger_row_with_plain_strings_reads(tmp_path):
    store = HealthStore(tmp_path)
    old = NodeStateChanged(
        ts=1.0, node="n2", from_state="suspect", to_state="probation", action="resume", reason="r"
    )
    store.append("n2", [old])
    assert store.records()["n2"].state is NodeState.PROBATION


def test_backends_by_name():
    assert isinstance(make_backend("local"), LocalBackend)
    assert isinstance(make_backend("slurm"), SlurmBackend)
    with pytest.raises(ConfigError, match="unknown backend 'k8s'"):
        make_backend("k8s")


def test_tiers_sort_fastest_first_by_kind(tmp_path):
    tiers = [
        TierConfig(name=k, kind=k, location=str(tmp_path / k))
        for k in ("object", "shared", "memory", "local")
    ]
    assert [t.kind for t in validate_tiers(tiers)] == ["memory", "local", "shared", "object"]
    assert [t.tier_kind.speed for t in validate_tiers(tiers)] == [0, 1, 2, 3]
    mem, obj = validate_tiers(tiers)[0], validate_tiers(tiers)[3]
    assert not mem.durable and not mem.do_fsync and mem.is_file
    assert obj.durable and not obj.is_file


def test_on_busy_refuses_an_unknown_mode(tmp_path):
    tier = TierConfig(name="disk", kind="local", location=str(tmp_path / "disk"))
    with pytest.raises(ValueError):
        CheckpointEngine([tier], on_busy="queue")  # type: ignore[arg-type]
    eng = CheckpointEngine([tier], on_busy="wait")
    try:
        assert eng.on_busy is OnBusy.WAIT
    finally:
        eng.close()
