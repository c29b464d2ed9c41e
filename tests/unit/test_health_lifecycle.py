"""Node lifecycle as a pure function, and the actuator that records it in the ledger."""

from __future__ import annotations

from dataclasses import replace

from stalwart.events.node_health import HealthAlert, HealthChecked, NodeDrained, NodeResumed, NodeStateChanged
from stalwart.health.findings import Finding, Severity
from stalwart.health.lifecycle import (
    UNCHECKED,
    CheckOutcome,
    LifecyclePolicy,
    NodeRecord,
    NodeState,
    SchedulerView,
    transition,
)
from stalwart.health.node_controller import apply_verdict
from stalwart.health.node_store import HealthStore
from stalwart.health.rules import load_rules
from stalwart.ledger import read_merged

P = LifecyclePolicy()
FAIL = CheckOutcome("fail", "fail: Xid 48 on gpu0", True, "xid-reset")
WARN = CheckOutcome("warn", "warn: PCIe replays")
PASS = CheckOutcome("pass", "pass")
REVAL = CheckOutcome("pass", "pass", revalidation=True)
OURS = SchedulerView(drained=True, reason="stalwart: fail: Xid 48 on gpu0")


def test_full_cycle_healthy_suspect_quarantined_probation_healthy():
    r = NodeRecord("n1")
    t = transition(r, WARN, None, P, now=1)
    assert t.record.state == NodeState.SUSPECT and t.action == "none"
    t = transition(t.record, FAIL, SchedulerView(False), P, now=2)
    assert t.record.state == NodeState.QUARANTINED and t.action == "drain"
    assert t.drain_reason.startswith("stalwart: ") and "Xid 48" in t.drain_reason
    t = transition(t.record, REVAL, OURS, P, now=3)
    assert t.record.state == NodeState.PROBATION and t.action == "resume"
    t = transition(t.record, PASS, SchedulerView(False), P, now=4)
    assert t.record.state == NodeState.HEALTHY and t.action == "none"


def test_two_warnings_in_a_row_quarantine():
    t = transition(NodeRecord("n"), WARN, None, P, 1)
    t = transition(t.record, WARN, None, P, 2)
    assert t.record.state == NodeState.QUARANTINED and t.action == "drain" and "warned 2" in t.reason


def test_suspect_recovers_on_pass():
    t = transition(NodeRecord("n"), WARN, None, P, 1)
    t = transition(t.record, PASS, None, P, 2)
    assert t.record.state == NodeState.HEALTHY


def test_operator_drain_is_never_touched():
    op = SchedulerView(drained=True, reason="maintenance: swap PSU")
    for rec in (NodeRecord("n"), NodeRecord("n", state=NodeState.QUARANTINED, reason="x")):
        for out in (FAIL, REVAL, WARN):
            t = transition(rec, out, op, P, 5)
            assert t.action == "none" and t.record == rec and "not Stalwart's" in t.reason


def test_readmission_needs_revalidation():
    q = NodeRecord("n", state=NodeState.QUARANTINED, reason="x", fault_key="xid-reset")
    t = transition(q, PASS, OURS, P, 5)
    assert t.action == "none" and t.record.state == NodeState.QUARANTINED and "active" in t.reason
    t = transition(q, PASS, OURS, replace(P, readmit_requires_active=False), 5)
    assert t.action == "resume"


def test_irrecoverable_needs_a_human():
    t = transition(NodeRecord("n"), replace(FAIL, recoverable=False), SchedulerView(False), P, 1)
    assert t.record.needs_human
    t2 = transition(t.record, REVAL, OURS, P, 2)
    assert t2.action == "none" and t2.record.state == NodeState.QUARANTINED and "operator" in t2.reason


def test_same_fault_after_readmission_escalates():
    t = transition(NodeRecord("n"), FAIL, SchedulerView(False), P, 0)
    t = transition(t.record, REVAL, OURS, P, 100)
    assert t.record.state == NodeState.PROBATION
    t = transition(t.record, FAIL, SchedulerView(False), P, 200)
    assert t.action == "drain" and t.record.needs_human and not t.record.recoverable
    assert "escalated to irrecoverable" in t.reason
    # a different fault family is not a recurrence
    t3 = transition(
        replace(t.record, needs_human=False, state=NodeState.PROBATION),
        replace(FAIL, fault_key="ib-link"),
        SchedulerView(False),
        P,
        300,
    )
    assert t3.record.recoverable


def test_blast_radius_cap_alerts_instead_of_draining():
    t = transition(NodeRecord("n"), FAIL, SchedulerView(False), P, 1, recent_auto_drains=2)
    assert t.action == "alert" and t.record.state == NodeState.SUSPECT
    assert "blast-radius cap" in t.reason and "not draining n" in t.reason
    t = transition(NodeRecord("n"), FAIL, SchedulerView(False), P, 1, recent_auto_drains=1)
    assert t.action == "drain"


def test_quarantined_node_resumed_outside_goes_on_probation():
    q = NodeRecord("n", state=NodeState.QUARANTINED, reason="x")
    t = transition(q, PASS, SchedulerView(False), P, 5)
    assert t.record.state == NodeState.PROBATION and t.action == "none"


class FakeBackend:
    name = "fake"

    def __init__(self):
        self.state: dict[str, SchedulerView] = {}
        self.calls: list[tuple[str, str]] = []

    def view(self, node):
        return self.state.get(node, SchedulerView(False, "", "idle"))

    def drain(self, node, reason):
        self.calls.append(("drain", node))
        self.state[node] = SchedulerView(True, reason, "drained")
        return "drained"

    def resume(self, node):
        self.calls.append(("resume", node))
        self.state[node] = SchedulerView(False, "", "idle")
        return "idle"

    def list_nodes(self):
        return []


def _verdict(code: str | None):
    fs = [] if code is None else [Finding("gpu", code, "gpu0", Severity.FAIL, "bad")]
    return load_rules().evaluate(fs)


def test_controller_drains_resumes_and_writes_the_audit_trail(tmp_path):
    store, be, pol = HealthStore(tmp_path), FakeBackend(), LifecyclePolicy()
    a = apply_verdict(
        "n2", _verdict("gpu.remap.pending"), level="passive", backend=be, store=store, policy=pol, now=10
    )
    assert a.transition.action == "drain" and be.state["n2"].reason.startswith("stalwart: ")
    rec = store.record("n2")
    assert (
        rec.state == NodeState.QUARANTINED
        and rec.reason.startswith("fail: ")
        and rec.fault_key == "remap-pending"
    )
    # a second failing check keeps the node's reason (not "still quarantined: ...")
    apply_verdict(
        "n2", _verdict("gpu.remap.pending"), level="passive", backend=be, store=store, policy=pol, now=15
    )
    assert store.record("n2").reason == rec.reason and be.calls == [("drain", "n2")]
    a = apply_verdict("n2", _verdict(None), level="active", backend=be, store=store, policy=pol, now=20)
    assert a.transition.action == "resume" and be.calls == [("drain", "n2"), ("resume", "n2")]
    a = apply_verdict("n2", _verdict(None), level="passive", backend=be, store=store, policy=pol, now=30)
    assert store.record("n2").state == NodeState.HEALTHY
    evs = read_merged(list(tmp_path.glob("*.ledger")))
    kinds = [type(e).__name__ for e in evs]
    assert kinds.count("HealthChecked") == 4
    assert [e.to_state for e in evs if isinstance(e, NodeStateChanged)] == [
        "quarantined",
        "probation",
        "healthy",
    ]
    (d,) = [e for e in evs if isinstance(e, NodeDrained)]
    assert d.node == "n2" and d.read_back == "drained"
    assert [e for e in evs if isinstance(e, NodeResumed)][0].read_back == "idle"
    checked = [e for e in evs if isinstance(e, HealthChecked)][0]
    assert checked.findings[0]["code"] == "gpu.remap.pending"


def test_controller_caps_drains_across_nodes(tmp_path):
    store, be, pol = (
        HealthStore(tmp_path),
        FakeBackend(),
        LifecyclePolicy(max_auto_drains=2, drain_window_s=600),
    )
    for i, node in enumerate(("a", "b", "c")):
        apply_verdict(
            node, _verdict("gpu.lost"), level="passive", backend=be, store=store, policy=pol, now=100 + i
        )
    assert be.calls == [("drain", "a"), ("drain", "b")]
    alerts = [e for e in store.events() if isinstance(e, HealthAlert)]
    assert len(alerts) == 1 and alerts[0].node == "c"
    # outside the window the cap no longer applies
    apply_verdict("c", _verdict("gpu.lost"), level="passive", backend=be, store=store, policy=pol, now=1000)
    assert be.calls[-1] == ("drain", "c")


def test_ledger_decodes_health_events(tmp_path):
    from stalwart.events import decode, encode

    ev = NodeDrained(ts=1.0, node="n", backend="slurm", reason="stalwart: x")
    kind, payload = encode(ev)
    assert decode(kind, payload) == ev


def test_store_lists_quarantined_nodes_for_exclusion(tmp_path):
    store, be, pol = HealthStore(tmp_path), FakeBackend(), LifecyclePolicy()
    apply_verdict("a", _verdict("gpu.lost"), level="passive", backend=be, store=store, policy=pol, now=1)
    apply_verdict("b", _verdict(None), level="passive", backend=be, store=store, policy=pol, now=2)
    assert store.excluded() == {"a"}
    assert store.record("b").state is NodeState.HEALTHY


def test_a_nodes_first_pass_is_recorded_and_routine_passes_after_it_are_not(tmp_path):
    """A node that passed its first check is healthy on record, with when and what was checked, and
    comes from "never checked"; later passes that change nothing add nothing, so the ledger grows
    with incidents, not with the check interval."""
    store, be, pol = HealthStore(tmp_path), FakeBackend(), LifecyclePolicy()
    assert "b" not in store.records()  # never checked
    apply_verdict("b", _verdict(None), level="passive", backend=be, store=store, policy=pol, now=2)
    (changed,) = [e for e in store.events() if isinstance(e, NodeStateChanged)]
    assert (changed.from_state, changed.to_state, changed.ts) == (UNCHECKED, "healthy", 2)
    (checked,) = [e for e in store.events() if isinstance(e, HealthChecked)]
    assert (checked.level, checked.status) == ("passive", "pass")
    assert store.records()["b"].since == 2
    before = len(store.events())
    for t in (3, 4, 5):
        apply_verdict("b", _verdict(None), level="passive", backend=be, store=store, policy=pol, now=t)
    assert len(store.events()) == before and be.calls == []
