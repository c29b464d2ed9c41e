"""In-place recovery across nodes (agents on loopback, DDP on gloo under ``Session.run``):

* two nodes of two ranks, rank 1 on node n0 SIGKILLed mid-run: n0's agent replaces only that rank and
  announces the new generation in the round's worker store; n1's agent joins it, so every other rank
  keeps its process, the run ends bit-identical to an uninterrupted one and no rank restarts whole;
* two active nodes and a hot spare, one rank each, the agent of n1 SIGKILLed with its rank (a lost
  node): the spare sees n1's heartbeat stop while n0's rank waits, claims n1's place and starts its
  rank in the next generation; n0's rank keeps its process and hands over the live state, and the run
  ends bit-identical to an uninterrupted two-node run (dropout off: a lost node's random streams go
  with it);
* three nodes of one rank and no hot spare, the agent of n1 SIGKILLed with its rank: n0 (the first
  surviving node, which watches the heartbeats) shrinks the group in place to two ranks; the ranks of
  n0 and n2 keep their processes, n2's rank trains on as rank 1 of 2, no node restarts whole, and the
  data position is re-split once: no sample is taken twice or skipped;
* the plain loop idiom (no ``Session.run``) on two nodes of one rank, rank 1 (n1) asleep at step 17
  outside the collective rank 0 (n0) waits in: n1's agent kills its rank first, n0's holds its stop
  (its rank's stack waits in the collective), rank 0's collective fails on the closed connections and
  it leaves its live state in n0's memory; the whole group restarts and resumes at step 17 from it,
  bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.account.recovery import recoveries
from stalwart.events import DecisionTaken, IncidentRaised, JobEnded, ReformedInPlace, StepCompleted

from .runner import events, same_params, seen_samples, wait_listening

pytestmark = pytest.mark.e2e
SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "inplace_ddp.py")
STEPS, NODES, PER_NODE = 40, 2, 2
RANKS = NODES * PER_NODE


def _two_nodes(
    tmp: Path,
    *extra: str,
    nodes: int = NODES,
    per_node: int = PER_NODE,
    killed: str = "",
    env: dict[str, str] | None = None,
    nnodes: str = "",
) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = {}
    for i in range(nodes):
        cmd = [
            sys.executable,
            "-m",
            "stalwart.cli",
            "run",
            "-q",
            "--nnodes",
            nnodes or str(nodes),
            "--nproc-per-node",
            str(per_node),
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "inplace-nodes",
            "--run-dir",
            str(tmp / "run"),
            "--node-name",
            f"n{i}",
            "--local-addr",  # group rank i (torch orders nodes by address, then by pid, which can wrap)
            f"127.0.0.{i + 1}",
            *extra,
            SCRIPT,
            str(STEPS),
            str(tmp),
        ]
        procs[f"n{i}"] = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        if i == 0:
            wait_listening(port, procs["n0"])  # n0 hosts the rendezvous store
    try:
        outs = {n: p.communicate(timeout=420)[0] for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for n, p in procs.items():
        assert p.returncode == (-signal.SIGKILL if n == killed else 0), (n, outs)
    return outs


def _pids(tmp: Path) -> dict[int, list[int]]:
    return {r: [int(x) for x in (tmp / f"pids-rank{r}.txt").read_text().split()] for r in range(RANKS)}


@pytest.mark.timeout(900)
def test_a_rank_killed_on_one_node_is_replaced_in_place_and_the_other_node_joins(tmp_path):
    _two_nodes(tmp_path / "ref")
    _two_nodes(tmp_path / "cut", "--chaos", "crash@rank=1,step=17")
    cut = tmp_path / "cut"
    assert same_params(cut / "final.pt", tmp_path / "ref" / "final.pt"), (
        "in-place recovery changed the result"
    )
    pids = _pids(cut)
    assert len(pids[1]) == 2 and pids[1][0] != pids[1][1], pids  # the killed rank was replaced
    for r in (0, 2, 3):  # every other rank ran train() twice in the same process, on both nodes
        assert len(pids[r]) == 2 and pids[r][0] == pids[r][1], pids
    run = cut / "run"
    [done] = events(run, ReformedInPlace)
    assert done.node == "n0" and done.ranks == (1,) and done.lost_steps == 0 and done.bytes_moved > 0
    joined = [e for e in events(run, DecisionTaken) if e.action == "joined_in_place"]
    assert [e.node for e in joined] == ["n1"] and "node n0" in joined[0].reason, joined
    assert {e.attempt for e in events(run, StepCompleted)} == {0}  # no whole-group restart on either node
    assert {e.node: e.exit_code for e in events(run, JobEnded)} == {"n0": 0, "n1": 0}


@pytest.mark.timeout(900)
def test_a_lost_node_is_replaced_in_place_by_a_hot_spare(tmp_path):
    from stalwart.events import AttemptStarted, JobEnded

    env = {"INPLACE_DROPOUT": "0"}
    _two_nodes(tmp_path / "ref", per_node=1, env=env)
    # 2 to 3 nodes at a power-of-two size: two train, the third stands by; the first round waits for
    # all three (each agent can take tens of seconds to start on a busy machine)
    spare = ["--valid-sizes", "pow2", "--rdzv-conf", "last_call_timeout=60"]
    chaos = ["--chaos", "kill-agent@node=1,step=17"]
    _two_nodes(tmp_path / "cut", *spare, *chaos, nodes=3, nnodes="2:3", per_node=1, killed="n1", env=env)
    cut, run = tmp_path / "cut", tmp_path / "cut" / "run"
    assert same_params(cut / "final.pt", tmp_path / "ref" / "final.pt"), "the take-over changed the result"
    pid = {r: [int(x) for x in (cut / f"pids-rank{r}.txt").read_text().split()] for r in (0, 1)}
    assert len(pid[0]) == 2 and pid[0][0] == pid[0][1], pid  # n0's rank stayed and re-formed
    assert len(pid[1]) == 2 and pid[1][0] != pid[1][1], pid  # rank 1 is new, on the spare
    [took] = [e for e in events(run, DecisionTaken) if e.action == "take_over"]
    assert took.node == "n2" and "node n1 is lost" in took.reason, took
    assert [e.node for e in events(run, DecisionTaken) if e.action == "joined_in_place"] == ["n0"]
    [done] = events(run, ReformedInPlace)
    assert done.node == "n2" and done.ranks == (1,) and done.bytes_moved > 0
    assert {e.node for e in events(run, AttemptStarted) if e.attempt > 0} <= {"n2"}  # n0 never restarted
    [rec] = recoveries(events(run))  # the lost node, detected by the spare, recovered in place
    assert (rec.failure, rec.path) == ("agent_lost", "in-place") and rec.total_s is not None, rec
    assert {e.node: e.exit_code for e in events(run, JobEnded)} == {"n0": 0, "n2": 0}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("per_node", [1, 2])
def test_a_lost_node_without_a_spare_shrinks_the_group_in_place(tmp_path, per_node):
    from stalwart.events import AttemptStarted

    env = {"INPLACE_DROPOUT": "0", "INPLACE_DATA": "1"}
    # 2 to 3 nodes, any size valid: all three train; the first round waits for all three
    wait = ["--rdzv-conf", "last_call_timeout=60"]
    chaos = ["--chaos", "kill-agent@node=1,step=17"]
    _two_nodes(tmp_path, *wait, *chaos, nodes=3, nnodes="2:3", per_node=per_node, killed="n1", env=env)
    run, old, new = tmp_path / "run", 3 * per_node, 2 * per_node
    survivors = {r: r for r in range(per_node)} | {2 * per_node + i: per_node + i for i in range(per_node)}
    for r, new_rank in survivors.items():  # the survivors kept their processes, in their new places
        lines = (tmp_path / f"place-rank{r}.txt").read_text().splitlines()
        (pid0, rank0, world0), (pid1, rank1, world1) = (tuple(int(x) for x in ln.split()) for ln in lines)
        assert pid0 == pid1 and (rank0, world0) == (r, old) and (rank1, world1) == (new_rank, new), lines
    [shrunk] = [e for e in events(run, DecisionTaken) if e.action == "shrink_in_place"]
    assert (
        shrunk.node == "n0" and "node n1 is lost" in shrunk.reason and f"from {old} to {new}" in shrunk.reason
    )
    # a killed agent's host lives: the kernel closed its liveness connection, so n0 knew at once and
    # says so (a silent host would be "no heartbeat for 2.5s")
    assert "its agent's process is gone: its liveness connection closed" in shrunk.reason, shrunk.reason
    [lost] = [e for e in events(run, IncidentRaised) if e.rule.startswith("inplace:")]
    assert lost.rule == "inplace:dead-agent" and "n1" in lost.cause, lost
    assert [e.node for e in events(run, DecisionTaken) if e.action == "joined_in_place"] == ["n2"]
    [done] = events(run, ReformedInPlace)
    assert done.node == "n0" and done.ranks == () and (done.world_size, done.shrunk_from) == (new, old), done
    assert done.lost_steps <= 1, done  # at most the interrupted step
    assert {e.attempt for e in events(run, AttemptStarted)} == {0}  # no whole-group restart anywhere
    [rec] = recoveries(events(run))  # the lost node, detected by n0, recovered in place
    assert (rec.failure, rec.path) == ("agent_lost", "in-place") and rec.total_s is not None, rec
    assert {e.node: e.exit_code for e in events(run, JobEnded)} == {"n0": 0, "n2": 0}
    seen = seen_samples([tmp_path])
    assert sorted(seen) == list(range(STEPS)), sorted(seen)
    assert any(len(v) == old for v in seen.values()) and len(seen[STEPS - 1]) == new, seen
    taken = sorted(i for v in seen.values() for i in v)
    assert taken == list(range(len(taken))), taken  # every sample once: none twice, none skipped


@pytest.mark.timeout(900)
def test_a_rank_hung_on_another_node_is_killed_there_first_and_the_waiting_node_leaves_its_state(tmp_path):
    from stalwart.events import LEFT_IN_MEMORY, FailureDetected, TrainingResumed, WorkersStopped

    env = {"INPLACE_IDIOM": "loop", "INPLACE_DATA": "1"}
    _two_nodes(tmp_path / "ref", per_node=1, env=env)
    _two_nodes(tmp_path / "cut", "--chaos", "hang@rank=1,step=17", per_node=1, env=env)
    cut, run = tmp_path / "cut", tmp_path / "cut" / "run"
    stops = {e.node: e.reason for e in events(run, WorkersStopped) if e.attempt == 0}
    assert "n1" in stops and "this node holds the hung rank" in stops["n1"], stops
    hangs = [e for e in events(run, FailureDetected) if e.failure == "hang"]
    assert [e.node for e in hangs] == ["n1"], hangs  # n0 held its stop, and its rank ended by itself
    resumed = {e.attempt: e for e in events(run, TrainingResumed)}
    again = resumed[max(resumed)]
    assert again.step == 17, again  # only the interrupted step is redone
    assert again.from_checkpoint.startswith("live:rank0") and again.from_checkpoint.endswith(LEFT_IN_MEMORY)
    [rec] = recoveries(events(run))  # one interruption: n1's hang and n0's rank ending on it
    assert rec.path == "warm" and "left in node memory" in rec.why, rec
    assert same_params(cut / "final.pt", tmp_path / "ref" / "final.pt"), "the restart changed the result"
    for r in (0, 1):  # each rank took the same sample at each step (the last time it ran the step)
        assert _last_seen(cut, r) == _last_seen(tmp_path / "ref", r), r


def _last_seen(out: Path, rank: int) -> dict[int, str]:
    """Step -> the sample rank ``rank`` took at it the last time it ran that step (a whole-group restart
    starts new processes, whose calls count from 1 again)."""
    seen = {}
    for line in (out / f"seen-rank{rank}.txt").read_text().splitlines():
        _, step, index = line.split()
        seen[int(step)] = index
    return seen
