"""A group that shrank in place grows back in place when a node returns, over real stores: the
board between the nodes (offers, invitations, readiness and the group record) over a real TCPStore,
polled by a manual ticker on a manual clock (every poll is a real store call on the test's thread:
nothing sleeps), and a newcomer rank joining its generation's process group through the agent's
real TCPStore (train/reform.py). The pure policies are tests/unit/test_grow_policy.py; the agents'
side over fakes, tests/unit/test_grow_in_place.py."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed import TCPStore

from stalwart.job_key import JobKey, KeySource
from stalwart.launch.clock import ManualClock
from stalwart.launch.inplace import board_state
from stalwart.launch.inplace.board import KEY, VERSION, Announcement, ManualTicker, StoreBoard
from stalwart.protocol import Reforming
from stalwart.protocol.pipe import Receiver
from stalwart.train.inplace import Generation
from stalwart.train.reform import Reformer
from stalwart.train.session import Session

pytestmark = pytest.mark.integration

SIGNER = JobKey(b"k" * 32, KeySource.FILE).signer("job")  # one job key for every board of a test

# --- the board over a real TCPStore, polled on a manual ticker ----------------------------------------


@pytest.fixture
def server():
    return TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def _boards(server, *nodes: str, notes=None):
    """Boards of ``nodes`` over ``server`` and the manual ticker that polls them (on this thread)."""
    clock = ManualClock()
    ticker = ManualTicker(clock)
    note = notes.append if notes is not None else lambda text: None
    boards = [
        StoreBoard(
            "127.0.0.1", server.port, 10.0, note, node=n, signer=SIGNER, ticker=ticker, clock=clock.monotonic
        )
        for n in nodes
    ]
    return ticker, boards


def test_offers_invitations_readiness_and_the_group_record_pass_between_two_boards(server):
    ticker, (first, newcomer, other) = _boards(server, "n0", "n2", "n3")
    ticker.tick()
    assert first.answered and newcomer.answered and other.answered
    assert first.offers() == () and newcomer.invited() is None and first.group() is None
    newcomer.offer("n2")
    ticker.tick(2)  # the newcomer writes after the first node polled: the next tick reads it
    assert first.offers() == ("n2",)
    other.offer("n3")
    ticker.tick(2)
    assert first.offers() == ("n2", "n3")
    newcomer.withdraw("n2")
    ticker.tick(2)
    assert first.offers() == ("n3",)
    newcomer.offer("n2")  # the order is the order of the last offers
    ticker.tick(2)
    assert first.offers() == ("n3", "n2")
    assert (first.offer_seq("n2"), first.offer_seq("n3"), first.offer_seq("n9")) == (2, 1, 0)

    invitation = Announcement(2, "n0", (4, 5), 6, ("n0", "n1", "n2"))
    first.invite(invitation)
    ticker.tick()
    assert newcomer.invited() == invitation and first.invited() == invitation

    newcomer.ready(2)
    ticker.tick(2)
    assert first.ready_nodes() == {"n2": 2}

    first.publish_group(invitation)
    ticker.tick()
    # the group record has no ranks: it says which nodes the group holds, not which ranks are new
    assert newcomer.group() == Announcement(2, "n0", (), 6, ("n0", "n1", "n2"))
    assert first.latest() is None  # publishing the group is not an announcement


def test_a_malformed_or_unsigned_document_is_ignored_and_the_last_good_one_stands(server):
    notes: list[str] = []
    ticker, (board, writer) = _boards(server, "n0", "n1", notes=notes)
    good = Announcement(2, "n0", (2, 3), 4, ("n0", "n1"))
    writer.invite(good)
    writer.offer("n2")
    ticker.tick(2)
    assert board.invited() == good and board.offers() == ("n2",)
    where = f"127.0.0.1:{server.port}"
    stored = board_state.open_state(SIGNER, where, server.get(KEY), 0)
    assert isinstance(stored, board_state.BoardState)
    doc = json.loads(board_state.encode(stored))
    doc["version"] += 1
    doc["invitation"]["generation"] = "two"
    server.set(KEY, SIGNER.seal(f"board/state|{where}", json.dumps(doc)))
    server.add(VERSION, 1)
    ticker.tick()
    assert board.invited() == good  # the last well-formed one stands
    assert any("malformed board state" in n and "generation 'two'" in n for n in notes), notes
    doc["invitation"]["generation"] = 9
    doc["offers"].append({"node": "n6", "seq": 1, "standing": True})
    server.set(KEY, json.dumps(doc))  # well formed but not signed: planted by someone without the key
    server.add(VERSION, 1)
    ticker.tick()
    assert board.invited() == good and board.offers() == ("n2",)
    assert board.refusals.count == 2 and any("unsigned board state" in n for n in notes), notes
    board.offer("n7")  # the next write replaces the planted document, built on the last good one
    ticker.tick(2)
    assert writer.offers() == ("n2", "n7") and writer.invited() == good


# --- a newcomer rank joins its generation's group through the agent's real store ----------------------


def test_a_replacement_rank_says_it_is_about_to_join_once_just_before_it_joins(server, tmp_path):
    """The agent's store is a real TCPStore; the group a real gloo group of one (a group of six would
    wait for five other processes). The rank says once, in its launch rank, that it is about to join
    generation 2; every key the joins wrote lies under generation 2's prefix."""
    rx = Receiver()
    env = {
        "RANK": "4",
        "WORLD_SIZE": "6",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(server.port),
        "STALWART_W_IPC": str(rx.new_channel()),
    }
    joined: list[tuple[int, int]] = []
    try:
        with Session(env) as session:
            gen = Generation(2, lambda: 0, lambda s: None, session.clock.now)
            reformer = Reformer(session, gen, 10.0, tmp_path)
            reformer.joining = True
            for _ in range(2):  # then a later generation of the same process: a survivor now
                reformer.init_group("gloo", 0, 1)
                try:
                    joined.append((dist.get_rank(), dist.get_world_size()))
                finally:
                    dist.destroy_process_group()
        msgs = [m for m in rx.drain() if isinstance(m, Reforming)]
    finally:
        rx.close()
    assert joined == [(0, 1)] * 2
    keys = server.list_keys()
    assert keys and all(k.startswith("stalwart/gen2/") for k in keys), keys
    assert [(m.rank, m.generation) for m in msgs] == [(4, 2)], msgs
