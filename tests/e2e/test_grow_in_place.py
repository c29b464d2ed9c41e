"""A group that shrank in place grows back in place (agents on loopback, DDP on gloo under
``Session.run``).

Three nodes of one rank (DDP), no hot spare; the agent of n1 is SIGKILLed with its rank at step 17, and n0
shrinks the group in place to two ranks (tests/e2e/test_in_place_nodes.py checks that part). Then
n1 starts again, as a repaired host would: before joining the rendezvous its agent finds the running
round's worker store, sees a group below ``--nnodes MAX`` and offers itself; n0 takes it in at the
next step boundary. The ranks of n0 and n2 keep their processes through both re-formations, n1's new
rank receives the live state from a replica, no node restarts whole, and the data position is
re-split at each change: every sample is taken exactly once. The same with FSDP2 + HSDP, two ranks a
node sharding within it: a replica group drops out and comes back, its shards sent by a replica."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netutil import free_port
from stalwart.account.report import build
from stalwart.events import AttemptStarted, DecisionTaken, JobEnded, ReformedInPlace, StepCompleted

from .runner import events, events_so_far, seen_samples, wait_listening

pytestmark = pytest.mark.e2e
SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "inplace_ddp.py")
FSDP = str(Path(__file__).parent / "scripts" / "fsdp_train.py")
STEPS = 3000  # an upper bound: the test ends the run 20 steps after the group grew back
AFTER = 20


def _agent(
    tmp: Path,
    port: int,
    i: int,
    job: list[str],
    per_node: int,
    *extra: str,
    quiet: bool = True,
    run_id: str = "grow-in-place",
) -> subprocess.Popen:
    """Agent ``n<i>`` of a 2:3 job; ``run_id`` must be the calling file's own (it names the nodes'
    memory tiers in /dev/shm, and another file's job may run at the same time)."""
    cmd = [
        sys.executable,
        "-m",
        "stalwart.cli",
        "run",
        *(["-q"] if quiet else []),
        "--nnodes",
        "2:3",
        "--nproc-per-node",
        str(per_node),
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--run-dir",
        str(tmp / "run"),
        "--node-name",
        f"n{i}",
        "--local-addr",
        f"127.0.0.{i + 1}",
        "--rdzv-conf",
        "last_call_timeout=60",  # the first round waits for all three
        *extra,
        *job,
    ]
    env = {
        **os.environ,
        "INPLACE_DROPOUT": "0",
        "INPLACE_DATA": "1",
        "INPLACE_STOP_FILE": str(tmp / "stop-at"),
    }
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _shrink_then_grow(tmp: Path, per_node: int, job, kill_step: int, after: int) -> tuple[list, list, dict]:
    """Three agents of ``job(output dir)``; n1's agent is killed with its ranks at ``kill_step``, and once
    the group shrank it starts again; ``after`` steps after the group grew back, the run ends. The
    shrink's and the grow's records, and every agent's exit code (all checked to be as expected)."""
    port, run = free_port(), tmp / "run"
    procs: dict[str, subprocess.Popen] = {}
    outs: dict[str, str] = {}
    try:
        for i in range(3):
            chaos = ("--chaos", f"kill-agent@node=1,step={kill_step}") if i == 1 else ()
            procs[f"n{i}"] = _agent(tmp, port, i, job(tmp / "first"), per_node, *chaos)
            if i == 0:
                wait_listening(port, procs["n0"])  # n0 hosts the rendezvous store
        shrunk = _until(
            "the shrink", lambda: [e for e in events_so_far(run, ReformedInPlace) if e.shrunk_from], procs
        )
        assert procs["n1"].wait(timeout=60) == -signal.SIGKILL
        outs["n1-lost"] = procs.pop("n1").communicate()[0]
        procs["n1"] = _agent(
            tmp, port, 1, job(tmp / "back"), per_node
        )  # the host is back: same name and address
        grown = _until(
            "the grow", lambda: [e for e in events_so_far(run, ReformedInPlace) if e.grown_from], procs
        )
        latest = max((e.step for e in events_so_far(run, StepCompleted)), default=0)
        part = tmp / "stop-at.tmp"
        part.write_text(str(max(latest, grown[0].step) + after))
        part.rename(tmp / "stop-at")  # whole, so no rank reads a partial number
        for n, p in procs.items():
            outs[n] = p.communicate(timeout=300)[0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert {n: p.returncode for n, p in procs.items()} == {"n0": 0, "n1": 0, "n2": 0}, outs
    return shrunk, grown, outs


def _until(what: str, check, procs: dict[str, subprocess.Popen], timeout_s: float = 300.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if all(p.poll() is not None for p in procs.values()):
            break
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen")


def _places(path: Path) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in ln.split()) for ln in path.read_text().splitlines()]  # type: ignore[misc]


@pytest.mark.timeout(900)
def test_a_returning_node_is_taken_back_in_place_by_the_shrunk_group(tmp_path):
    run, first, back = tmp_path / "run", tmp_path / "first", tmp_path / "back"

    def job(out: Path) -> list[str]:
        out.mkdir(parents=True, exist_ok=True)
        return [SCRIPT, str(STEPS), str(out)]

    shrunk, _, _ = _shrink_then_grow(tmp_path, 1, job, 17, AFTER)
    assert shrunk[0].node == "n0" and (shrunk[0].shrunk_from, shrunk[0].world_size) == (3, 2)
    [grow] = [e for e in events(run, DecisionTaken) if e.action == "grow_in_place"]
    assert grow.node == "n0" and "node n1 offered" in grow.reason and "from 2 to 3" in grow.reason, grow
    [done] = [e for e in events(run, ReformedInPlace) if e.grown_from]
    assert done.node == "n0" and (done.grown_from, done.world_size, done.ranks) == (2, 3, (2,)), done
    assert done.lost_steps <= 1, done  # at most the interrupted step
    joined = [e for e in events(run, DecisionTaken) if e.action == "joined_in_place"]
    assert [e.node for e in joined] == ["n2", "n2"] and "grew the group back" in joined[1].reason, joined
    # the survivors kept their processes: launched as 0 and 2 of 3, then 0 and 1 of 2, then 0 and 1 of 3
    assert [p[1:] for p in _places(first / "place-rank0.txt")] == [(0, 3), (0, 2), (0, 3)]
    assert [p[1:] for p in _places(first / "place-rank2.txt")] == [(2, 3), (1, 2), (1, 3)]
    for r in (0, 2):
        assert len({p[0] for p in _places(first / f"place-rank{r}.txt")}) == 1, r
    assert [p[1:] for p in _places(back / "place-rank2.txt")] == [(2, 3)]  # n1's new rank, at the end
    starts = {(e.node, e.attempt, e.world_size) for e in events(run, AttemptStarted)}
    assert starts == {("n0", 0, 3), ("n1", 0, 3), ("n2", 0, 3)}, starts  # no whole-group restart anywhere
    assert {e.node: e.exit_code for e in events(run, JobEnded)} == {"n0": 0, "n1": 0, "n2": 0}
    seen = seen_samples([first, back])
    last = max(seen)
    assert sorted(seen) == list(range(last + 1)), sorted(seen)
    sizes = [len(seen[s]) for s in sorted(seen)]
    assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3, sizes  # full, reduced, full again
    assert sizes.index(2) > 0 and all(n == 3 for n in sizes[len(sizes) - AFTER :]), sizes
    taken = sorted(i for v in seen.values() for i in v)
    assert taken == list(range(len(taken))), taken  # every sample once: none twice, none skipped
    # the report books the steps at the reduced batch: from the shrink to the grow, once each
    changes = build(run)["world_changes"]
    assert [c["kind"] for c in changes["changes"]] == ["shrink", "grow"], changes
    [period] = changes["periods"]
    assert (period["world_size"], period["full_world"], period["ended_by"]) == (2, 3, "grow"), period
    assert (period["first_step"], period["last_step"]) == (shrunk[0].step, done.step - 1), period
    assert period["steps"] == done.step - shrunk[0].step == sizes.count(2), (period, sizes)


@pytest.mark.timeout(900)
def test_an_hsdp_replica_group_drops_out_and_comes_back_with_its_shards_from_a_replica(tmp_path):
    """FSDP2 + HSDP with shards of 2 on each node (3 replica groups of 2): the lost node's replica
    group drops out (the group re-forms as 2 x 2, every survivor keeping its own shards: no checkpoint
    is loaded) and, once it returns, its new ranks receive their shards from the ranks that hold the
    same shards in another replica group (3 x 2 again)."""
    pytest.importorskip("torchdata")
    from stalwart.events import CheckpointLoaded, TrainingResumed

    run = tmp_path / "run"
    stop = str(tmp_path / "stop-at")

    def job(out: Path) -> list[str]:  # no checkpoint after step 0 is due: a fallback would show as lost steps
        return [FSDP, "--steps", "3000", "--checkpoint-every", "1000", "--mesh", "x2", "--in-place"] + [
            "--stop-file",
            stop,
        ]

    shrunk, grown, _ = _shrink_then_grow(tmp_path, 2, job, 8, 5)
    assert (shrunk[0].node, shrunk[0].shrunk_from, shrunk[0].world_size) == ("n0", 6, 4), shrunk
    assert (grown[0].node, grown[0].grown_from, grown[0].world_size, grown[0].ranks) == ("n0", 4, 6, (4, 5))
    resumes = [(e.node, e.step, e.from_checkpoint) for e in events(run, TrainingResumed)]
    lost = [(e.node, e.step, e.lost_steps, e.phases) for e in (*shrunk, *grown)]
    assert shrunk[0].lost_steps <= 1 and grown[0].lost_steps <= 1, (lost, resumes)
    assert not events(run, CheckpointLoaded), "a checkpoint was loaded"  # none was written after step 0
    resumed = [e.from_checkpoint for e in events(run, TrainingResumed) if e.step > 0]  # after each re-form
    assert len(resumed) == 2 and all(o.startswith("live:") for o in resumed), resumed
    [back] = [
        e for e in events(run, ReformedInPlace) if e.node == "n1" and e.generation == grown[0].generation
    ]
    assert back.bytes_moved > 0 and back.ranks == (4, 5), back  # the newcomer's shards, from a replica
    assert not [e for e in events(run, AttemptStarted) if e.attempt > 0], "a node restarted whole"
    assert {e.node: e.exit_code for e in events(run, JobEnded)} == {"n0": 0, "n1": 0, "n2": 0}
