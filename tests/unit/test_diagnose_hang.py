"""Hang attribution: the least advanced rank is the culprit; a hang joins node evidence like a comm error."""

from __future__ import annotations

import pytest

from stalwart.diagnose.cross_layer import diagnose_comm_failure
from stalwart.diagnose.hang import RankPosition, attribute_hang
from stalwart.diagnose.incident import Component
from stalwart.diagnose.signals import from_failure, from_ps_states
from stalwart.errors import ConfigError
from stalwart.events import FailureDetected


def pos(rank, step, section, seen, node="n1", finished=False):
    return RankPosition(rank, node, step, section, seen, finished)


def test_rank_still_loading_data_is_the_culprit_not_the_ones_waiting_in_backward():
    ranks = [
        pos(0, 12, "backward", 100.0),
        pos(1, 12, "backward", 100.5),
        pos(2, 12, "data", 99.0, node="n2"),
        pos(3, 12, "backward", 100.2, node="n2"),
    ]
    h = attribute_hang(ranks, now=140.0, timeout_s=30.0)
    assert h.culprit == 2 and h.node == "n2" and h.victims == (0, 1, 3) and h.onset == 99.0
    assert h.reason == (
        "rank 2 on n2 silent 41.00s at step 12, section 'data' (timeout 30.00s, training); "
        "others at step 12 'backward'"
    )


def test_a_waiting_ranks_longer_silence_is_named_when_it_reached_the_timeout():
    ranks = [pos(0, 33, "forward", 100.10), pos(1, 33, "backward", 100.04)]
    h = attribute_hang(ranks, now=104.0, timeout_s=3.95)
    assert h.culprit == 0 and h.silence_s == pytest.approx(3.90)
    assert h.reason == (
        "rank 0 on n1 silent 3.90s at step 33, section 'forward' (timeout 3.95s, training); "
        "others at step 33 'backward'; longest silence 3.96s, rank 1"
    )


def test_lower_step_beats_section_and_finished_ranks_do_not_count():
    ranks = [pos(0, 11, "optimizer", 50.0), pos(1, 12, "data", 50.0), pos(2, 3, None, 10.0, finished=True)]
    assert attribute_hang(ranks, now=100.0, timeout_s=30.0).culprit == 0


def test_no_verdict_before_the_timeout_or_without_live_ranks():
    assert attribute_hang([pos(0, 1, "data", 90.0)], now=100.0, timeout_s=30.0) is None
    assert attribute_hang([pos(0, 1, "data", 0.0, finished=True)], now=100.0, timeout_s=30.0) is None
    with pytest.raises(ConfigError):
        attribute_hang([], now=0.0, timeout_s=0.0)


def test_a_hang_on_a_rank_in_d_state_is_a_hung_mount():
    h = attribute_hang(
        [pos(0, 5, "backward", 100.0), pos(1, 5, "data", 98.0, node="n2")], now=400.0, timeout_s=300.0
    )
    hang = from_failure(
        FailureDetected(
            ts=400.0, node=h.node, rank=h.culprit, failure="hang", onset=h.onset, evidence=h.reason
        )
    )
    assert hang.code == "process.hang"
    dstate = from_ps_states("77 D+ nfs_wait_bit_killable\n", "n2", 120.0, {77: 1})
    inc = diagnose_comm_failure([hang], dstate, now=400.0)
    assert inc.component is Component.MOUNT and inc.blast_radius.ranks == (1,)
    alone = diagnose_comm_failure([hang], [], now=400.0)
    assert alone.cause.startswith("hang with no node-level cause")


# faulthandler's format (every thread, innermost frame first); the paths are made up
_BEAT = """Thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/stalwart/train/heartbeat.py", line 40 in _beat
  File "/py/lib/python3.11/threading.py", line 982 in run
  File "/py/lib/python3.11/threading.py", line 1002 in _bootstrap
"""


def _main(*frames: str, current: bool = True) -> str:
    head = "Current thread" if current else "Thread"
    lines = [
        f'  File "{path}", line {i + 1} in {func}'
        for i, (path, func) in enumerate(f.split(":") for f in frames)
    ]
    return f"{head} 0x00007f0000000002 (most recent call first):\n" + "\n".join(lines) + "\n"


def test_a_rank_blocked_in_a_collective_is_told_from_one_that_never_reached_it():
    from stalwart.diagnose.hang import waits_in_collective

    outer = ("/job/train.py:train", "/job/train.py:<module>")
    ddp = "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py:_pre_forward"
    backward = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py:_engine_run_backward"
    reduce = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:all_reduce"
    for waiting in (ddp, backward, reduce):
        assert waits_in_collective(_BEAT + "\n" + _main(waiting, *outer)) is True, waiting
    # asleep in the script, or in a hook of the SDK: outside any collective
    assert waits_in_collective(_BEAT + "\n" + _main(*outer)) is False
    chaos = "/venv/lib/python3.11/site-packages/stalwart/train/chaos_hook.py:fire"
    assert waits_in_collective(_main(chaos, *outer) + "\n" + _BEAT) is False
    # a forward pass in torch's modules is work, not a wait
    linear = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:forward"
    assert waits_in_collective(_main(linear, *outer)) is False


def test_the_main_thread_is_the_one_running_the_top_level_whichever_thread_dumped():
    from stalwart.diagnose.hang import waits_in_collective

    reduce = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:barrier"
    # python -m: runpy's frames sit outside the module's top level
    launched = (reduce, "/job/train.py:<module>", "/py/lib/python3.11/runpy.py:_run_code")
    dumped_by_beat = _BEAT.replace("Thread", "Current thread", 1) + "\n" + _main(*launched, current=False)
    assert waits_in_collective(dumped_by_beat) is True
    # no top-level frame anywhere (a worker started by a function): the thread that dumped
    assert waits_in_collective(_BEAT + "\n" + _main(reduce, "/job/worker.py:main")) is True
    # nothing to go by: an empty or foreign dump, or no thread that tells
    assert waits_in_collective("") is None
    assert waits_in_collective("Process 123: python train.py\nThread 123 (idle)\n") is None
    assert waits_in_collective(_BEAT) is None
