"""In-place re-formation, worker side: a survivor leaves the broken process group, waits for the
agent's word, joins the next generation and keeps its live state.

The script's training function runs under :meth:`stalwart.train.Session.run`. When it raises a
communication error (a peer died: gloo reports the closed connection) or the agent asks every worker
to re-form between two steps (:class:`Reform`), the session:

1. **abandons** the old group: it shuts down the group's TCP connections (every established TCP
   socket of this process except the one to the agent's store), so that a peer still waiting on this
   rank in a collective fails at once instead of waiting out the process-group timeout, and destroys
   the group. gloo has no abort that unblocks a waiting collective (``ProcessGroupGloo.abort`` returns
   while the wait goes on, checked on torch 2.13), so the connections are what must go; with NCCL the
   group's own abort does the same;
2. **waits**, bounded, for the agent's re-form request (the control block's ``reform`` field): the
   agent has replaced the failed ranks by then; no request in time means the agent chose another rung
   of the recovery ladder, and the original error is raised as it would have been without in-place;
3. runs the training function again. :meth:`init_process_group` joins the new generation through a
   fresh prefix of the agent's store; :meth:`loop` takes the live state (train/live_state.py) instead
   of loading a checkpoint.

A failure that is not a communication error (the script's own bug) is never retried here: it would
only fail again. It propagates, and the agent's restart policy decides.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol.error_record import COMM_TEXT, COMM_TYPES


class Reform(Exception):  # noqa: N818 - a request, not an error
    """Raised between two steps when the agent asks every worker to re-form its process group."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"the agent asked the workers to re-form into generation {generation}")
        self.generation = generation


def is_comm_failure(exc: BaseException) -> bool:
    """A failure a re-formed group can recover from: a request to re-form, or the communication
    error a survivor sees when a peer is gone."""
    if isinstance(exc, Reform):
        return True
    if not isinstance(exc, Exception):
        return False
    return bool(COMM_TYPES.search(type(exc).__name__) or COMM_TEXT.search(str(exc)[:500]))


def _tcp_inodes() -> dict[str, tuple[str, int]]:
    """Socket inode -> (state, remote port) for this process's TCP sockets (IPv4 and IPv6)."""
    out: dict[str, tuple[str, int]] = {}
    for name in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9:
                out[f[9]] = (f[3], int(f[2].rpartition(":")[2], 16))
    return out


def sever_connections(keep_ports: set[int]) -> int:
    """Shut down (not close: the group still owns the descriptors) every established TCP connection of
    this process whose remote port is not in ``keep_ports``; the number shut down."""
    table = _tcp_inodes()
    done = 0
    for fd_name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd_name}")
        except OSError:
            continue
        if not target.startswith("socket:["):
            continue
        entry = table.get(target[8:-1])
        if entry is None or entry[0] != "01" or entry[1] in keep_ports:  # 01: ESTABLISHED
            continue
        try:  # the group's own threads may close a descriptor between the listing and here
            sock = socket.socket(fileno=int(fd_name))
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass
        finally:
            sock.detach()
    return done


def abandon_group(store_port: int) -> int:
    """Leave the current default process group so that no peer waits on this rank: sever its
    connections (kept: the agent's store) and destroy it. Connections severed."""
    import torch.distributed as dist  # deferred: heavy (torch)

    if not dist.is_initialized():
        return 0
    severed = sever_connections({store_port}) if dist.get_backend() == "gloo" else 0
    if dist.get_backend() == "nccl":
        try:
            dist.distributed_c10d._abort_process_group()  # NCCL: abort the communicators
        except Exception:  # noqa: BLE001 - destroying below is what remains
            pass
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group may fail to tear down cleanly; it is dropped
        pass
    return severed


@dataclass
class Generation:
    """Which process-group generation this worker is in, and how it learns of the next one."""

    current: int
    read_request: Callable[[], int]  # the control block's reform field (0: none)
    sleep: Callable[[float], None]
    now: Callable[[], float]

    def requested(self) -> int:
        """A generation newer than the current one that the agent asked for, else 0."""
        want = self.read_request()
        return want if want > self.current else 0

    def wait(self, timeout_s: float, poll_s: float = 0.005) -> int:
        """Wait (bounded) for the agent's request; the new generation, or 0 when none came in time or
        the agent said none is coming."""
        deadline = self.now() + timeout_s
        while True:
            asked = self.read_request()
            want = asked if asked > self.current else 0
            if want or asked < 0 or self.now() >= deadline:  # < 0: the agent refused
                return want
            self.sleep(poll_s)

    def store_prefix(self) -> str:
        return f"stalwart/gen{self.current}/"


STUCK_MIN_S = 0.5  # a re-form request pending this long (at least) inside one step: the step is stuck
STUCK_FACTOR = 3.0  # ...and this many times the usual step: a loaded machine's slow step is not stuck
STUCK_POLL_S = 0.02  # how often the watch reads the control block (a memory read, no system call)


def sever_due(pending_s: float, usual_step_s: float | None) -> bool:
    """Pure: whether a re-form request that has been pending ``pending_s`` while this rank's step has
    not reached its boundary means the step waits on a peer that will never answer, so the group's
    connections must go for the step to fail and the rank to re-form.

    A peer that died closes its connections and the step fails by itself; a host that went silent
    (cut off, powered off) closes nothing, and gloo has no abort for a waiting collective, so the step
    would wait for the process-group timeout. A step that runs normally (the group grows back at a
    step boundary, nobody lost) reaches its boundary within three times its usual time
    (``usual_step_s``: the last step's, from its start to its boundary; None before the first), and
    never waits less than half a second: a step cut that did not have to be is redone, never lost."""
    return pending_s >= max(STUCK_MIN_S, STUCK_FACTOR * (usual_step_s or 0.0))


@dataclass
class StuckStep:
    """Worker side: a daemon thread that severs the group's connections (kept: the agent's store) when
    the agent asked for a new generation and this rank's step has not reached its boundary within
    :func:`sever_due`'s bound, so a survivor of a silent host re-forms in place without waiting for its
    process-group timeout. At most once per generation asked."""

    generation: Generation
    keep_port: int
    sever: Callable[[set[int]], int] = sever_connections
    poll_s: float = STUCK_POLL_S
    since: float | None = None  # when the current step began; None: at a boundary
    usual_s: float | None = None  # the last step's time from its start to its boundary
    pending: float | None = None  # when the request was first seen inside this step
    severed_for: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def step_began(self) -> None:
        self.since = self.generation.now()

    def boundary(self) -> None:
        if self.since is not None:
            self.usual_s = self.generation.now() - self.since
        self.since = self.pending = None

    def tick(self) -> bool:
        """One look; True when it severed the connections now."""
        want, since = self.generation.requested(), self.since
        if not want or since is None or want == self.severed_for:
            self.pending = None
            return False
        now = self.generation.now()
        if self.pending is None or self.pending < since:
            self.pending = now
        if not sever_due(now - self.pending, self.usual_s):
            return False
        self.severed_for = want
        self.sever({self.keep_port})
        return True

    def start(self) -> None:
        threading.Thread(target=self._run, name="stalwart-stuck-step", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except (ValueError, OSError):  # the control block was closed: the session is closing
                return

    def close(self) -> None:
        self._stop.set()
