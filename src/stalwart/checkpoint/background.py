"""The persist thread: one daemon worker that runs submitted calls in order and returns Futures.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits. A worker
whose training loop died on an exception (a peer rank was lost) could then never exit while its
persist waits in a collective for a rank that already gave up. Here the thread is a daemon:
``close``/``shutdown(wait=True)`` still waits for the running persist on a normal finish, and an
abandoned persist never committed anything (a version is visible only after its manifest's rename).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

EXIT_WAIT_S = 30.0


def lower_thread_priority(nice: int) -> None:
    """Run the calling thread ``nice`` steps below its current CPU priority (Linux: per thread), so
    background work (a persist, a verification) yields to the training loop."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError:
        pass


class Background:
    def __init__(
        self, name: str, initializer: Callable[..., None] | None = None, initargs: tuple = ()
    ) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, args=(initializer, initargs), name=name, daemon=True
        )
        self._thread.start()
        atexit.register(self.shutdown, True, EXIT_WAIT_S)

    def _run(self, initializer, initargs) -> None:
        if initializer is not None:
            initializer(*initargs)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                fut.set_exception(exc)

    # Any: concurrent.futures.Executor.submit's own signature
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._closed:
            raise RuntimeError("cannot submit to a closed persist thread")
        fut: Future = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop after the submitted calls; ``wait``: join the thread (at most ``timeout`` s)."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
        if wait:
            self._thread.join(timeout)
