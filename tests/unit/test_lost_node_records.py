"""The lost node's failure and incident, as the first surviving node records them: a dead agent
(its liveness connection closed) and a silent host (its heartbeat past the bound) are named apart."""

from __future__ import annotations

import pytest

from stalwart.launch.inplace.records import lost_without_spare

CTX = {"run_id": "r", "node": "n0", "attempt": 0}


def test_a_dead_agents_failure_and_incident_say_its_process_is_gone():
    failure, incident = lost_without_spare(
        ("n1",), "n0", ("n0", "n1", "n2"), {"n1": 0.4}, 2, 100.0, CTX, dead={"n1": 0.25}
    )
    assert failure.failure == "agent_lost" and failure.rank == 2
    assert failure.onset == pytest.approx(99.75)  # when the watcher saw the connection end
    assert "its agent's process is gone (its liveness connection closed)" in failure.evidence
    assert incident.rule == "inplace:dead-agent" and incident.confidence == 0.95
    assert incident.cause.startswith("host n1 left the job: its agent died (its process is gone")


def test_a_silent_host_keeps_its_heartbeat_verdict():
    failure, incident = lost_without_spare(("n1",), "n0", ("n0", "n1"), {"n1": 2.6}, 1, 100.0, CTX, dead={})
    assert failure.onset == pytest.approx(97.4) and "no heartbeat for 2.6s" in failure.evidence
    assert incident.rule == "inplace:silent-host"


def test_a_silent_host_found_before_any_rank_waited_is_not_said_to_have_been_waited_for():
    """Outside an incident (the survivors' ranks blocked in a step, none erred) the verdict rests on
    the line's quiet and the kernel's: the records say that, not that the witness's ranks waited."""
    failure, incident = lost_without_spare(
        ("n2",), "n0", ("n0", "n1", "n2"), {"n2": 2.7}, 1, 100.0, CTX, dead={}, waited=False
    )
    assert failure.onset == pytest.approx(97.3) and "nothing from its host" in failure.evidence
    assert "wait" not in incident.cause and "nothing from its host" in incident.cause
    assert incident.rule == "inplace:silent-host" and "blocked in a step" in incident.cause
    assert any("no segment on any connection for 2.7s" in e for e in incident.evidence), incident.evidence
    _, waited = lost_without_spare(("n2",), "n0", ("n0", "n1", "n2"), {"n2": 2.7}, 1, 100.0, CTX, dead={})
    assert "while the ranks of n0 waited" in waited.cause


def test_an_agent_that_left_the_job_on_purpose_is_named_so_not_as_dead():
    failure, incident = lost_without_spare(
        ("n1",), "n0", ("n0", "n1"), {"n1": 0.2}, 1, 100.0, CTX, dead={"n1": 0.1}, left=frozenset({"n1"})
    )
    assert failure.onset == pytest.approx(99.9) and "left the job on purpose" in failure.evidence
    assert "process is gone" not in failure.evidence
    assert incident.rule == "inplace:node-left" and "excluded its own node" in incident.cause
