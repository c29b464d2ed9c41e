"""One vocabulary (policy/vocabulary.py): the report, ``/metrics``, the dashboard's JSON, the alert
rules and the docs print failure kinds, restart causes, components, fault classes, recovery paths and
node states only from it. Ledgers of many paths go through every surface; a scanner collects each
labelled word and the test fails on any word outside the vocabulary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stalwart.account.report import build
from stalwart.diagnose.incident import BlastRadius, Incident
from stalwart.diagnose.kill_cause import load_kill_rules
from stalwart.diagnose.root_cause import component_class, incident_class
from stalwart.events import (
    AttemptStarted,
    DecisionTaken,
    Event,
    FailureDetected,
    JobEnded,
    JobStarted,
    ReformedInPlace,
    StepCompleted,
    TrainingResumed,
    WorkersStarted,
    WorkersStopped,
)
from stalwart.events.node_health import HealthChecked, NodeStateChanged
from stalwart.ledger import LedgerWriter, read_merged
from stalwart.policy.vocabulary import WORDS, FailureKind
from stalwart.serve.dashboard import snapshot_json
from stalwart.serve.metrics import render
from stalwart.serve.snapshot import take
from stalwart.serve.synthetic import SyntheticRun, events
from vocab import LABELS, outside, words_in, words_in_metrics  # tests/ is on sys.path (its conftest)

ROOT = Path(__file__).resolve().parents[2]
RUN = "vocab"


def _ctx(attempt: int = 0, node: str = "n0") -> dict:
    return {"run_id": RUN, "node": node, "attempt": attempt}


def _steps(t: float, attempt: int, first: int, n: int, node: str = "n0") -> list[Event]:
    return [
        StepCompleted(
            ts=t + i * 0.1 + r * 0.01,
            step=first + i,
            start=t + i * 0.1 - 0.1,
            duration=0.1,
            rank=r,
            **_ctx(attempt, node),
        )
        for i in range(n)
        for r in (0, 1)
    ]


def _incident(component_of: str, evidence: str, ts: float) -> Event:
    fault_class, component = incident_class(component_class(component_of, evidence))
    inc = Incident(
        cause=evidence,
        fault_class=fault_class,
        component=component,
        confidence=0.5,
        action="restart",
        ts=ts,
        onset=ts - 0.1,
        rule="test",
        evidence=(evidence,),
        blast_radius=BlastRadius(nodes=("n0",), ranks=(1,)),
    )
    return inc.to_event(RUN, "n0", 0)


def many_paths() -> list[Event]:
    """A run of two nodes that meets every failure kind, a kill of every kill rule, an in-place
    recovery, a warm restart, a membership restart and health checks that pass and fail."""
    t = 1_800_000_000.0
    evs: list[Event] = [
        JobStarted(ts=t, script="train.py", nproc_per_node=2, run_id=RUN, node="n0"),
        HealthChecked(
            ts=t + 0.1, node="n0", status="pass", level="passive", action="none", reason="ok", run_id=RUN
        ),
        NodeStateChanged(
            ts=t + 0.1,
            node="n0",
            from_state="unknown",
            to_state="healthy",
            action="none",
            reason="gate passed",
            run_id=RUN,
        ),
        HealthChecked(
            ts=t + 0.2, node="n1", status="fail", level="passive", action="drain", reason="gpu", run_id=RUN
        ),
        NodeStateChanged(
            ts=t + 0.2,
            node="n1",
            from_state="unknown",
            to_state="quarantined",
            action="drain",
            reason="gpu",
            run_id=RUN,
        ),
        AttemptStarted(ts=t + 1, world_size=2, num_nodes=1, **_ctx()),
    ]
    evs += _steps(t + 1.1, 0, 0, 5)
    t += 2
    kinds = list(FailureKind)
    rules = [
        r.what.format(signal="SIGKILL", rss="1 GiB", tail="-", injected="crash")
        for r in load_kill_rules().rules
    ]
    for attempt, kind in enumerate(kinds + ["crash"] * len(rules)):
        evidence = rules[attempt - len(kinds)] if attempt >= len(kinds) else f"{kind} seen"
        evs.append(
            FailureDetected(
                ts=t + 0.3, failure=kind, evidence=evidence, onset=t, rank=1, step=5, **_ctx(attempt)
            )
        )
        evs.append(_incident(kind, evidence, t + 0.31))
        if attempt == 0:  # recovered in place
            evs.append(
                DecisionTaken(
                    ts=t + 0.35, action="in_place", reason="rank 1 replaced in place", **_ctx(attempt)
                )
            )
            evs.append(
                ReformedInPlace(
                    ts=t + 0.6,
                    generation=1,
                    ranks=(1,),
                    step=5,
                    lost_steps=0,
                    bytes_moved=10,
                    state_bytes=10,
                    phases={"abort": 0.05, "replace": 0.1, "transfer": 0.05},
                    **_ctx(attempt),
                )
            )
            evs += _steps(t + 0.7, attempt, 5, 2)
            t += 1
            continue
        evs.append(WorkersStopped(ts=t + 0.4, reason="stopped", **_ctx(attempt)))
        evs.append(DecisionTaken(ts=t + 0.45, action="restart", reason="restart", **_ctx(attempt)))
        evs.append(DecisionTaken(ts=t + 0.5, action="start_warm", reason="warm: forked", **_ctx(attempt + 1)))
        evs.append(AttemptStarted(ts=t + 0.5, world_size=2, num_nodes=1, **_ctx(attempt + 1)))
        evs.append(WorkersStarted(ts=t + 0.55, pids=(1, 2), global_ranks=(0, 1), **_ctx(attempt + 1)))
        evs += [TrainingResumed(ts=t + 0.8, step=5, rank=r, **_ctx(attempt + 1)) for r in (0, 1)]
        evs += _steps(t + 0.9, attempt + 1, 5, 2)
        t += 2
    last = len(kinds) + len(rules)
    # a node waiting to join: the group restarts with no failure to answer
    evs.append(
        DecisionTaken(ts=t, action="restart", reason="restart: a node is waiting to join", **_ctx(last))
    )
    evs.append(AttemptStarted(ts=t + 0.5, world_size=4, num_nodes=2, **_ctx(last + 1)))
    evs += _steps(t + 1, last + 1, 9, 3)
    evs.append(
        JobEnded(
            ts=t + 3,
            verdict="done",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
            run_id=RUN,
            node="n0",
        )
    )
    return sorted(evs, key=lambda e: e.ts)


LEDGERS = {
    "many paths": many_paths,
    "synthetic": lambda: list(events(SyntheticRun(crash_steps=(20, 40)))),
}


@pytest.mark.parametrize("name", sorted(LEDGERS))
def test_every_surface_prints_only_the_vocabulary(tmp_path: Path, name: str):
    with LedgerWriter(tmp_path / "agent.ledger", writer="test") as w:
        for ev in LEDGERS[name]():
            w.append(ev)
    report = build(tmp_path)
    evs = read_merged(tmp_path)
    snap = take(evs, evs[-1].ts + 1.0)
    dashboard = snapshot_json(snap, [], loading=False)
    metrics = render(snap, evs[-1].ts + 1.0).decode()
    found = [*words_in(report, "report"), *words_in(dashboard, "dashboard"), *words_in_metrics(metrics)]
    assert not outside(iter(found)), outside(iter(found))
    kinds = {k for k, _, _ in found}
    # the scan saw every kind of word the ledger holds (a scanner that finds nothing passes nothing)
    assert {"failure", "cause", "component"} <= kinds, kinds
    if name == "many paths":
        assert {"fault_class", "path", "node_state"} <= kinds, kinds
        restarts = dashboard["restarts_by_cause"]
        assert restarts.get("membership") == 1 and "unknown" not in restarts, restarts


def doc_rows(text: str) -> dict[str, set[str]]:
    """The backticked words of each row of a markdown table whose first cell is a backticked name."""
    rows: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = re.match(r"\| `(\w+)` \|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([^`]+)`", m.group(2)))
    return rows


def test_the_docs_list_each_kind_of_word_exactly_and_the_alerts_use_only_them():
    listed = doc_rows((ROOT / "docs/vocabulary.md").read_text())
    assert {kind: listed.get(kind) for kind in WORDS} == {kind: set(words) for kind, words in WORDS.items()}
    incident = doc_rows((ROOT / "docs/diagnosis.md").read_text())
    assert incident["component"] == set(WORDS["component"]) and incident["fault_class"] == set(
        WORDS["fault_class"]
    )
    alerts = (ROOT / "src/stalwart/serve/alerts.yml").read_text()
    found = [
        (LABELS[n], v, "alerts.yml")
        for n, v in re.findall(r'\b(cause|class|state)\s*=~?\s*"([^"]*)"', alerts)
    ]
    assert not outside(iter(found)), outside(iter(found))


def test_the_scanner_finds_a_word_outside_the_vocabulary():
    doc = {
        "interruptions": [{"failure": "infrastructure", "component": "gpu"}],
        "restarts_by_cause": {"unknown": 1},
    }
    assert outside(words_in(doc)) == [
        ("cause", "unknown", ".restarts_by_cause"),
        ("failure", "infrastructure", ".interruptions[0].failure"),
    ]
    metrics = 'stalwart_incidents_total{run="r",class="hang"} 1.0\n'
    assert outside(words_in_metrics(metrics)) == [("component", "hang", "stalwart_incidents_total")]
