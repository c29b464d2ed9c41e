"""A lost node without a hot spare, the group shrinks in place: the announcement that carries the new
world (and rejects a malformed one), the agents' side (the first surviving node decides and
announces, the others join in their new places) and the worker's side (the session takes its new
rank and world size, its messages keep the rank it was launched as). No processes, no sleeping."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from test_inplace_follow import _node  # the node of a multi-node group, over a fake board

from stalwart import protocol
from stalwart.events import DecisionTaken, FailureDetected, IncidentRaised, ReformedInPlace
from stalwart.launch.clock import ManualClock
from stalwart.launch.fakes import RecordingLedger
from stalwart.launch.inplace.board import Announcement
from stalwart.protocol import Reformed, Reforming
from stalwart.protocol.control import REFUSED
from stalwart.protocol.pipe import Receiver
from stalwart.train import Session
from stalwart.train.reform import move
from stalwart.train.worker_link import WorkerLink

SHRUNK = Announcement(3, "n0", (), 4, ("n0", "n2"))

# --- the announcement ---------------------------------------------------------------------------


def test_a_shrink_announcement_round_trips_and_gives_each_survivor_its_place():
    assert Announcement.decode(SHRUNK.encode()) == SHRUNK
    assert SHRUNK.place("n0", 2) == (0, 4) and SHRUNK.place("n2", 2) == (2, 4)
    assert SHRUNK.place("n1", 2) is None  # the lost node has no place


def test_an_announcement_without_a_new_world_reads_as_before():
    plain = Announcement(2, "n0", (1,))
    assert json.loads(plain.encode()) == {
        "generation": 2,
        "node": "n0",
        "ranks": [1],
    }  # what older agents read
    assert Announcement.decode(b'{"generation": 2, "node": "n0", "ranks": [1]}') == plain
    assert plain.place("n0", 2) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"world_size": 0}, "world_size 0 is not a positive integer"),
        ({"world_size": True}, "world_size True is not a positive integer"),
        ({"world_size": "4"}, "world_size '4' is not a positive integer"),
        ({"active": []}, "active is not a list of node names"),
        ({"active": "n0"}, "active is not a list of node names"),
        ({"active": ["n0", ""]}, "active is not a list of node names"),
        ({"active": ["n0", "n0"]}, "repeats a node"),
        ({"active": ["n1", "n2"]}, "lacks the announcing node"),
        ({"world_size": 5}, "not a multiple of 2 nodes"),
        ({"active": None}, "active is not a list"),
    ],
)
def test_a_malformed_shrink_announcement_is_rejected(change, why):
    doc = {**json.loads(SHRUNK.encode()), **change}
    with pytest.raises(ValueError, match=why):
        Announcement.decode(json.dumps(doc).encode())


# --- the agents -----------------------------------------------------------------------------------


def _waiting(rec, rank: int, clock: ManualClock) -> None:
    rec.tracker.observe(Reforming(rank, rec.generation + 1, 0.01, clock.now()), clock.now())


def test_the_first_survivor_shrinks_the_group_in_place_and_records_it_once_its_ranks_joined(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger, node="n0", ranks=(0, 1), active=("n0", "n1", "n2"))
    _waiting(rec, 0, clock)
    snap = SimpleNamespace(now=clock.now(), stop_requested_at=None)
    board.quiet = {"n1": 2.4, "n2": 0.3}  # under half the bound: not lost yet
    rec.watch(snap)
    assert block.reform() == 0 and board.sent == [("waiting", 1)]
    board.quiet = {"n1": 2.6, "n2": 0.3}
    rec.watch(snap)
    assert board.sent[-1] == Announcement(1, "n0", (), 4, ("n0", "n2"))
    assert (block.reform(), block.place()) == (1, (0, 4))
    assert (rec.generation, rec.world_size, rec.active) == (1, 4, ("n0", "n2"))
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "shrink_in_place"]
    assert "node n1 is lost" in why.reason and "from 6 to 4" in why.reason
    [lost] = ledger.of(FailureDetected)  # the lost node's failure, detected here: its agent is gone
    assert (lost.failure, lost.rank, lost.onset) == (
        "agent_lost",
        2,
        clock.now() - 2.6,
    ) and "n1" in lost.evidence
    # the survivor names the lost host, not itself: n1 is the blast radius, n0 its witness
    [inc] = ledger.of(IncidentRaised)
    assert (inc.node, inc.nodes, inc.action_taken) == ("n0", ("n1",), True)
    assert inc.cause.startswith("host n1 left the job") and inc.onset == lost.onset
    assert any(e.startswith("witness n0") for e in inc.evidence)
    assert not [e for e in ledger.of(DecisionTaken) if e.action in ("joined_in_place", "in_place_skipped")]
    for r in (0, 1):
        clock.advance(0.1)
        rec.watch(snap)
        assert not ledger.of(ReformedInPlace)  # not before every local rank joined
        phases = {"rendezvous": 0.2, "transfer": 0.05}
        rec.tracker.observe(Reformed(r, 1, 17, 0, phases, clock.now()), clock.now())
    rec.watch(snap)
    rec.watch(snap)
    [done] = ledger.of(ReformedInPlace)
    assert (done.ranks, done.world_size, done.shrunk_from, done.generation) == ((), 4, 6, 1)
    assert done.phases["join"] >= 0 and "replace" not in done.phases
    board.quiet = {"n1": 30.0, "n2": 0.3}  # the dropped node stays silent: never lost a second time
    _waiting(rec, 0, clock)
    rec.watch(snap)
    assert len(ledger.of(DecisionTaken)) == 1 and block.reform() == 1


def test_the_first_node_shrinks_out_a_lost_node_though_its_own_ranks_are_blocked_not_waiting(tmp_path):
    """A host that drops off the network resets nothing: the first node's ranks may block in a
    collective with it and never say they wait. Once the board reports the node lost (its silence is
    read during an incident: another node's ranks wait), the first node shrinks it out, and the
    re-form request is what unblocks its ranks (train/inplace.py StuckStep)."""
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger, node="n0", ranks=(0, 1), active=("n0", "n1", "n2"))
    snap = SimpleNamespace(now=clock.now(), stop_requested_at=None)
    board.quiet = {"n1": 2.4, "n2": 0.3}
    rec.watch(snap)
    assert block.reform() == 0 and not board.sent  # nobody lost, nobody waits: nothing said
    board.quiet = {"n1": 2.6, "n2": 0.3}
    rec.watch(snap)
    assert board.sent[-1] == Announcement(1, "n0", (), 4, ("n0", "n2"))
    assert (block.reform(), block.place()) == (1, (0, 4))


def test_a_survivor_that_sees_a_host_gone_silent_says_it_waits_so_a_spare_can_take_the_place(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(
        tmp_path, clock, ledger, node="n2", ranks=(4, 5), active=("n0", "n1", "n2"), spares=True
    )
    board.quiet = {"n1": 2.6}  # its ranks are blocked with n1, not failed
    rec.watch(SimpleNamespace(now=clock.now(), stop_requested_at=None))
    assert ("waiting", 1) in board.sent and block.reform() == 0


def test_a_generation_another_node_announced_is_joined_rather_than_shrunk_over(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger, node="n0", ranks=(0, 1), active=("n0", "n1", "n2"))
    _waiting(rec, 0, clock)
    board.quiet = {"n1": 2.6, "n2": 0.3}
    board.seen = Announcement(1, "n2", (4,))  # n2 replaced a rank of its own at the same moment
    rec.watch(SimpleNamespace(now=clock.now(), stop_requested_at=None))
    assert (block.reform(), block.place()) == (1, None) and not board.sent
    assert [e.action for e in ledger.of(DecisionTaken)] == ["joined_in_place"]


def test_a_survivor_joins_the_shrunk_group_in_its_new_place(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger, node="n2", ranks=(4, 5), active=("n0", "n1", "n2"))
    _waiting(rec, 4, clock)
    board.seen = Announcement(1, "n0", (), 4, ("n0", "n2"))
    rec.watch(SimpleNamespace(now=clock.now(), stop_requested_at=None))
    assert (block.reform(), block.place()) == (1, (2, 4))  # its ranks 4 and 5 train as 2 and 3
    assert (rec.world_size, rec.num_nodes, rec.active) == (4, 2, ("n0", "n2"))
    [joined] = [e for e in ledger.of(DecisionTaken) if e.action == "joined_in_place"]
    assert "node n0 shrank the group in place to 4 processes" in joined.reason


def test_a_node_left_out_of_the_shrunk_group_tells_its_ranks_none_is_coming(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    rec, board, block = _node(tmp_path, clock, ledger, node="n2", ranks=(4, 5), active=("n0", "n1", "n2"))
    _waiting(rec, 4, clock)
    board.seen = Announcement(1, "n0", (), 4, ("n0", "n1"))  # it was taken for lost
    rec.watch(SimpleNamespace(now=clock.now(), stop_requested_at=None))
    assert block.reform() == REFUSED and block.place() is None
    [why] = [e for e in ledger.of(DecisionTaken) if e.action == "in_place_skipped"]
    assert "without this node" in why.reason


def test_a_shrink_to_no_valid_size_is_refused_before_the_full_bound(tmp_path):
    clock, ledger = ManualClock(), RecordingLedger()
    four = ("n0", "n1", "n2", "n3")
    rec, board, block = _node(tmp_path, clock, ledger, node="n0", ranks=(0,), active=four, valid_sizes="pow2")
    _waiting(rec, 0, clock)
    board.quiet = {"n1": 2.6, "n2": 0.1, "n3": 0.1}
    rec.watch(SimpleNamespace(now=clock.now(), stop_requested_at=None))
    assert block.reform() == REFUSED and ("refuse", ledger.of(DecisionTaken)[-1].reason) in board.sent
    assert "3 processes is not a power of two" in ledger.of(DecisionTaken)[-1].reason


# --- the worker -----------------------------------------------------------------------------------

PLACE = {"RANK": "4", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2"}


def test_the_session_takes_its_new_rank_and_world_size_in_a_shrunk_group(monkeypatch, tmp_path):
    from stalwart.errors import CheckpointError

    monkeypatch.setenv("RANK", "4")  # the process's environment held the launch place
    monkeypatch.setenv("WORLD_SIZE", "9")  # a value the script set itself is left alone
    env = {**PLACE, "GROUP_WORLD_SIZE": "3", "ROLE_RANK": "4", "ROLE_WORLD_SIZE": "6"}
    with Session(env, checkpoint_dir=str(tmp_path)) as session:
        move(session, 2, 4)
        assert (session.rank, session.world_size, session.local_rank) == (2, 4, 0)
        want = {"RANK": "2", "WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "2"}
        assert {k: session.env[k] for k in want} == want and session.env["ROLE_WORLD_SIZE"] == "4"
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("2", "9")
        with pytest.raises(RuntimeError, match="does not fit"):
            move(session, 4, 4)
        # the checkpoint engine is built for the new world: of 4 (which needs a process group) ...
        with pytest.raises(CheckpointError, match="world_size=4 but torch.distributed is not initialized"):
            session.checkpointer  # noqa: B018 - the property builds the engine
        move(session, 0, 1)  # ... and of one, where it saves as rank 0 of 1 (launched as 4 of 6)
        assert (session.checkpointer.rank, session.checkpointer.world_size) == (0, 1)


def _comm_failure() -> Exception:
    return Exception("Connection closed by peer")  # what a survivor sees when a peer is gone


def test_the_session_takes_the_place_the_agent_wrote_when_it_re_forms(tmp_path):
    from stalwart.protocol import control

    ctl = tmp_path / "ctl.bin"
    control.create(ctl, slots=2)
    agent = control.ControlBlock(ctl, writable=True)
    rx = Receiver()
    env = {**PLACE, "STALWART_W_IPC": str(rx.new_channel()), "STALWART_W_CONTROL": str(ctl)}
    env["STALWART_W_RUN_DIR"] = str(tmp_path)
    places: list[tuple[int, int]] = []

    def train(session: Session) -> str:
        places.append((session.rank, session.world_size))
        if len(places) == 1:
            agent.request_reform(1, (0, 4))  # the agent shrank the group while this rank trained
            raise _comm_failure()
        return "trained"

    try:
        with Session(env) as session:
            assert session.run(train) == "trained"
        msgs = rx.drain()
    finally:
        agent.close()
        rx.close()
    assert places == [(4, 6), (0, 4)]  # nothing written at the start: the launch place; then the new one
    assert [(m.rank, m.generation) for m in msgs if isinstance(m, Reforming)] == [(4, 1)]


def test_live_state_is_kept_across_a_change_of_world_and_judged_part_for_part_when_adopted(tmp_path):
    import torch

    from stalwart.protocol import control
    from stalwart.train.inplace import Generation
    from stalwart.train.reform import Reformer

    ctl = tmp_path / "ctl.bin"
    control.create(ctl, slots=2)
    agent = control.ControlBlock(ctl, writable=True)
    worker = control.ControlBlock(ctl)  # the worker's view of the same block
    rx = Receiver()
    env = {**PLACE, "STALWART_W_IPC": str(rx.new_channel()), "STALWART_W_CONTROL": str(ctl)}
    held: list[object] = []
    try:
        with Session(env) as session:
            gen = Generation(0, worker.reform, lambda s: None, session.clock.now)
            reformer = Reformer(session, gen, 1.0, tmp_path)

            def train(s: Session) -> tuple[int, int]:
                if gen.current > 0:
                    held.append(reformer.held)  # what the re-form kept of the last generation's state
                if gen.current == 0:
                    reformer.state = {"model": torch.nn.Linear(2, 2)}  # what the loop adopted
                    agent.request_reform(1)  # the same world (a rank replaced)
                    raise _comm_failure()
                if gen.current == 1:
                    reformer.state = {"model": torch.nn.Linear(2, 2)}
                    agent.request_reform(
                        2, (0, 4)
                    )  # shrunk: whether each part still fits is adopt's to judge
                    raise _comm_failure()
                return s.world_size, gen.current

            assert reformer.run(train) == (4, 2)
    finally:
        worker.close()
        agent.close()
        rx.close()
    assert len(held) == 2 and all(h is not None for h in held), held


def test_held_state_fits_new_objects_only_where_every_local_part_sits_in_the_same_place():
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from stalwart.train.live_state import same_shards

    a, b = torch.zeros(4, 4), torch.ones(4, 4)
    assert same_shards({"w": a}, {"w": b})  # a DDP replica: full tensors of the same shape
    assert not same_shards({"w": a}, {"w": torch.zeros(2, 4)})  # cut into another shape
    assert not same_shards({"w": a}, {"v": b})  # other objects
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        flat = init_device_mesh("cpu", (1,))
        hsdp = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
        rows = distribute_tensor(a, flat, [Shard(0)])
        assert same_shards({"w": rows}, {"w": distribute_tensor(b, flat, [Shard(0)])})
        # a replicate dim beside the same shard dim: the shards are where they were (HSDP)
        assert same_shards({"w": rows}, {"w": distribute_tensor(b, hsdp, [Replicate(), Shard(0)])})
        assert not same_shards(
            {"w": rows}, {"w": distribute_tensor(b, flat, [Shard(1)])}
        )  # cut the other way
        assert not same_shards({"w": rows}, {"w": b})  # sharded before, whole now
    finally:
        dist.destroy_process_group()


def test_messages_keep_the_rank_the_worker_was_launched_as():
    rx = Receiver()
    wenv = SimpleNamespace(ipc_fd=rx.new_channel(), control="")
    try:
        link = WorkerLink(wenv, rank=4, local_rank=0)  # type: ignore[arg-type]
        link.send(protocol.Note(2, "trained as rank 2 of a shrunk group", 1.0))
        link.send(protocol.Note(4, "as launched", 2.0))
        link.close()
        got = rx.drain()
    finally:
        rx.close()
    assert [(m.rank, m.text) for m in got] == [(4, "trained as rank 2 of a shrunk group"), (4, "as launched")]


def test_the_console_and_the_ledger_say_the_job_shrank_in_place():
    import io

    from stalwart.events import decode, encode
    from stalwart.launch.console import RunConsole

    ev = ReformedInPlace(
        ts=1.0,
        generation=1,
        ranks=(),
        step=18,
        lost_steps=0,
        bytes_moved=0,
        state_bytes=0,
        phases={},
        world_size=2,
        shrunk_from=3,
        node="n0",
    )
    live = io.StringIO()
    RunConsole(stream=live).event(ev)
    assert "shrank in place from 3 to 2 processes" in live.getvalue()
    assert decode(*encode(ev)) == ev  # the new fields survive the ledger
    old = {k: v for k, v in ev.to_payload().items() if k not in ("world_size", "shrunk_from")}
    before = decode("ReformedInPlace", old)  # a ledger written before reads as unchanged
    assert isinstance(before, ReformedInPlace) and (before.world_size, before.shrunk_from) == (0, 0)


def test_an_error_record_after_a_shrink_is_filed_under_the_rank_the_agent_launched(tmp_path):
    import sys

    from stalwart.protocol.error_record import read_error

    with Session({**PLACE, "STALWART_W_RUN_DIR": str(tmp_path)}) as session:
        move(session, 2, 4)
        try:
            raise ValueError("boom")
        except ValueError as exc:
            sys.excepthook(ValueError, exc, exc.__traceback__)  # what Python calls for an uncaught one
        path = session.run_dir.error_file(session.node, session.attempt, 4)
    record = read_error(path)
    assert record is not None and record.message == "boom"
