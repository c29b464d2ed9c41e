"""Survivors' communication tracebacks stay off the console; a user's own traceback is shown whole."""

from __future__ import annotations

from stalwart.launch.processes.peer_errors import MAX_HELD_LINES, PeerErrorFilter

GLOO = b"""Traceback (most recent call last):
  File "/w/train.py", line 40, in <module>
    loss.backward()
  File "/venv/torch/_tensor.py", line 521, in backward
    torch.autograd.backward(
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4711
"""

USER = b"""Traceback (most recent call last):
  File "/w/train.py", line 12, in <module>
    batch = next(it)
KeyError: 'labels'
"""

CHAINED = b"""[rank2]: Traceback (most recent call last):
[rank2]:   File "/w/train.py", line 40, in step
[rank2]:     dist.all_reduce(t)
[rank2]: torch.distributed.DistBackendError: NCCL communicator was aborted
[rank2]:
[rank2]: The above exception was the direct cause of the following exception:
[rank2]:
[rank2]: Traceback (most recent call last):
[rank2]:   File "/w/train.py", line 50, in <module>
[rank2]: torch.distributed.DistBackendError: watchdog caught collective operation timeout
"""


def run(text: bytes) -> bytes:
    f, out = PeerErrorFilter(), []
    for line in text.splitlines(keepends=True):
        out += f.feed(line)
    return b"".join(out + f.flush())


def test_a_survivors_gloo_traceback_stays_off_the_console():
    assert run(b"step 9 loss 2.1\n" + GLOO + b"bye\n") == b"step 9 loss 2.1\nbye\n"


def test_a_users_own_exception_is_shown_whole():
    assert run(b"step 1\n" + USER) == b"step 1\n" + USER


def test_a_chained_nccl_traceback_with_rank_prefixes_is_held_to_its_last_exception():
    # the first exception line is a comm error too, and ends the first block: nothing is shown
    assert run(CHAINED).strip() == b""


def test_a_stream_ending_inside_a_traceback_shows_what_it_held():
    cut = b"".join(GLOO.splitlines(keepends=True)[:3])
    assert run(cut) == cut


def test_an_endless_traceback_is_shown_once_the_hold_is_full():
    text = b"Traceback (most recent call last):\n" + b'  File "x.py", line 1\n' * (MAX_HELD_LINES + 5)
    assert run(text) == text
