"""Agent <-> worker channels: the memory-mapped control block and the non-blocking pipes."""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stalwart.protocol import CheckpointDone, Finished, StepBegan, StepDone, control, encode
from stalwart.protocol.pipe import Receiver, Sender


@contextmanager
def _blocks(tmp_path, slots: int = 0, slot: int | None = None) -> Iterator[tuple]:
    """A new control block, its worker-side reader (on ``slot``) and its agent-side writer."""
    path = tmp_path / "ctl" / "a0.bin"
    control.create(path, slots=slots)
    reader = control.ControlBlock(path, slot=slot)
    writer = control.ControlBlock(path, writable=True)
    try:
        yield path, reader, writer
    finally:
        reader.close()
        writer.close()


def test_control_block_stop_request_is_seen_by_the_reader(tmp_path):
    with _blocks(tmp_path) as (path, reader, writer):
        assert reader.stop_after() == -1
        writer.request_stop(42)
        assert reader.stop_after() == 42
        writer.request_stop(43)
        assert reader.stop_after() == 43
        # generation counts the writes
        assert struct.unpack("<qqqqq", path.read_bytes()) == (43, 2, 0, -1, 0)


def test_control_block_reform_request_is_seen_and_keeps_the_stop_request(tmp_path):
    with _blocks(tmp_path, slots=2, slot=1) as (_, reader, writer):
        assert reader.reform() == 0
        writer.request_stop(7)
        writer.request_reform(3)
        assert (reader.reform(), reader.stop_after()) == (3, 7)
        writer.request_stop(9)  # a later stop request leaves the re-form generation alone
        assert (reader.reform(), reader.stop_after()) == (3, 9)
        reader.beat(1.0, 5, "forward")  # the slots sit after the longer header
        assert writer.read_beat(1) == (1.0, 5, "forward")


def test_a_shrink_request_carries_the_nodes_new_place_and_later_requests_keep_it(tmp_path):
    with _blocks(tmp_path, slots=2, slot=0) as (_, reader, writer):
        assert reader.place() is None  # a new block: every worker keeps its launch place
        writer.request_stop(7)
        writer.request_reform(2, (2, 4))  # this node's ranks start at 2 in a world of 4
        assert (reader.reform(), reader.place(), reader.stop_after()) == (2, (2, 4), 7)
        writer.request_reform(3)  # a later re-formation in the shrunk group keeps the place
        writer.request_stop(9)
        assert (reader.reform(), reader.place(), reader.stop_after()) == (3, (2, 4), 9)
        writer.refuse_reform()
        assert (reader.reform(), reader.place()) == (control.REFUSED, (2, 4))
        for bad in ((4, 4), (-1, 2), (0, 0)):
            with pytest.raises(ValueError, match="does not fit"):
                writer.request_reform(5, bad)
        assert (reader.reform(), reader.place()) == (control.REFUSED, (2, 4))  # a bad place writes nothing
        reader.beat(1.0, 5, "forward")  # the slots sit after the header with the place
        assert writer.read_beat(0) == (1.0, 5, "forward")


def test_messages_round_trip_through_the_pipe():
    rx = Receiver()
    w = rx.new_channel()
    tx = Sender(w)
    try:
        assert fcntl.fcntl(w, fcntl.F_GETFL) & os.O_NONBLOCK
        msgs = [StepBegan(0, i, 1.5 + i) for i in range(50)]
        for m in msgs:
            tx.send(m)
        assert rx.drain() == msgs
        assert rx.drain() == []
        assert tx.dropped == 0
    finally:
        tx.close()
        rx.close()


def test_partial_lines_wait_and_garbage_is_dropped():
    rx = Receiver()
    w = rx.new_channel()
    try:
        os.write(w, b'{"k":"step","r":0,"s":1,"t":2.0}\n{"k":"ck')
        assert rx.drain() == [StepBegan(0, 1, 2.0)]
        os.write(
            w,
            b'pt","r":0,"s":1,"t":3.0}\nnot json\n{"k":"nope","r":0,"t":1}\n{"k":"fin","r":1,"s":2,"pre":true,"t":4.0}\n',
        )
        assert rx.drain() == [CheckpointDone(0, 1, 3.0), Finished(1, 2, True, 4.0)]
    finally:
        os.close(w)
        rx.close()


def test_several_channels_are_drained():
    rx = Receiver()
    ws = [rx.new_channel() for _ in range(3)]
    senders = [Sender(w) for w in ws]
    try:
        for r, s in enumerate(senders):
            s.send(StepBegan(r, 0, 1.0))
        assert sorted(m.rank for m in rx.drain()) == [0, 1, 2]
    finally:
        for s in senders:
            s.close()
        rx.close()


@pytest.mark.timeout(10)
def test_a_full_pipe_drops_messages_instead_of_blocking():
    rx = Receiver()
    w = rx.new_channel()
    tx = Sender(w)
    try:
        msg = StepDone(0, 0, 1.0, 0.1, {"data": 0.01, "forward": 0.02})
        size = len(encode(msg))
        n = 2 * (1 << 20) // size  # far more than any pipe buffer holds
        for i in range(n):
            tx.send(StepDone(0, i, 1.0, 0.1, {"data": 0.01, "forward": 0.02}))  # never blocks
        assert tx.dropped > 0
        got = []
        while True:
            batch = rx.drain()
            if not batch:
                break
            got.extend(batch)
        # everything that was not dropped arrived whole and in order
        assert len(got) == n - tx.dropped
        assert [m.step for m in got] == list(range(len(got)))
        # once drained, sending works again
        tx.send(Finished(0, 3, False, 9.0))
        assert rx.drain() == [Finished(0, 3, False, 9.0)]
    finally:
        tx.close()
        rx.close()


def test_oversized_message_loses_its_sections_not_its_step():
    rx = Receiver()
    tx = Sender(rx.new_channel())
    try:
        big = StepDone(0, 7, 1.0, 0.5, {f"s{i}": 0.001 for i in range(500)})
        tx.send(big)
        assert rx.drain() == [StepDone(0, 7, 1.0, 0.5, {})]
    finally:
        tx.close()
        rx.close()


def test_a_gone_agent_is_counted_not_raised():
    r, w = os.pipe()
    os.close(r)
    tx = Sender(w)
    try:
        tx.send(StepBegan(0, 1, 1.0))  # EPIPE: the agent died
        assert tx.dropped == 1
    finally:
        tx.close()
