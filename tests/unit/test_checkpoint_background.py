"""The persist thread: calls run in order, errors reach the waiter, and it never blocks exit."""

from __future__ import annotations

import threading

import pytest

from stalwart.checkpoint.background import Background


def test_calls_run_in_order_and_errors_reach_the_waiter():
    bg = Background("t")
    seen: list[int] = []
    futs = [bg.submit(seen.append, i) for i in range(5)]
    bad = bg.submit(lambda: 1 / 0)
    assert [f.result(timeout=10) for f in futs] == [None] * 5 and seen == [0, 1, 2, 3, 4]
    with pytest.raises(ZeroDivisionError):
        bad.result(timeout=10)
    bg.shutdown(wait=True, timeout=10)
    with pytest.raises(RuntimeError):
        bg.submit(seen.append, 9)


def test_a_stuck_call_does_not_hold_the_thread_hostage_at_shutdown():
    bg = Background("t")
    release = threading.Event()
    fut = bg.submit(release.wait, 30)
    bg.shutdown(wait=True, timeout=0.2)  # bounded: returns although the call still runs
    assert bg._thread.daemon and not fut.done()
    release.set()
    assert fut.result(timeout=10) is True
