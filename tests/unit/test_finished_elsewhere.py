"""A late agent whose rendezvous store went with a job that succeeded learns it from the run
directory's ledger (launch/failure_files.py ``CheckpointFiles.finished_elsewhere``)."""

from __future__ import annotations

from pathlib import Path

from stalwart.events import JobEnded
from stalwart.launch.failure_files import CheckpointFiles
from stalwart.ledger import LedgerWriter
from stalwart.protocol.run_dir import RunDir

T = 1_800_000_000.0


def _ended(tmp_path: Path, node: str, ts: float, outcome: str = "succeeded") -> None:
    with LedgerWriter(tmp_path / f"agent-{node}-{int(ts)}.ledger", writer=f"agent {node}") as w:
        w.append(
            JobEnded(
                ts=ts,
                verdict="done",
                outcome=outcome,
                exit_code=0,
                requeue_helps=False,
                node=node,
                run_id="r",
            )
        )


def test_another_nodes_success_since_this_agent_started_is_told_and_nothing_else_is(tmp_path: Path):
    run = RunDir(tmp_path).create()
    files = CheckpointFiles(run, node="h1", since=T)
    assert files.finished_elsewhere() == ""  # nothing ended
    _ended(run.root, "h0", T - 100.0)  # an earlier job of the run: not this one's end
    _ended(run.root, "h1", T + 5.0)  # this node's own verdict says nothing of the others
    _ended(run.root, "h2", T + 6.0, outcome="infra_exhausted")
    assert files.finished_elsewhere() == ""
    _ended(run.root, "h0", T + 7.0)
    said = files.finished_elsewhere()
    assert said.startswith("the job already succeeded on h0 at ") and "run directory's ledger" in said
