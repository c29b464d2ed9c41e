"""A rendezvous backend over one value in memory, for the sealed backend's unit tests
(tests/unit/test_job_key.py, tests/unit/test_sealed_backoff.py), and a pickle that runs a command
when loaded (what a planted rendezvous state would carry)."""

from __future__ import annotations

import os
import threading


class MemoryBackend:
    """One value with compare-and-set on a version token (as c10d's and etcd's backends), safe to
    share between threads (several agents writing at once)."""

    name = "memory"

    def __init__(self) -> None:
        self.value: bytes | None = None
        self.version = 0
        self.lock = threading.Lock()

    def get_state(self):
        with self.lock:
            return None if self.value is None else (self.value, self.version)

    def set_state(self, state, token=None):
        with self.lock:
            if (token or 0) == self.version:
                self.value, self.version = state, self.version + 1
                return state, self.version, True
            return self.value, self.version, False


class Bomb:
    """Runs ``exit 3`` in a shell when unpickled."""

    def __reduce__(self):
        return (os.system, ("exit 3",))
