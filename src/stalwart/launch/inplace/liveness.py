"""Whether another node's agent process is alive, told by the kernel rather than by a heartbeat.

A heartbeat's silence cannot tell a dead agent from a slow or cut-off one, so the board waits out a
bound (half of ``--in-place-announce-timeout``) before it counts a node lost. But when an agent's
process dies and its host's kernel lives (a SIGKILL, an OOM kill, a crash), the kernel closes every
socket the process held at once. So each agent listens on a liveness port of its own (:class:`Line`)
and the nodes that watch it (the first node, the hot spares) hold one TCP connection to it
(:class:`Watch`): nothing is ever sent on it while the agent lives; an agent that leaves on purpose
sends one goodbye byte before it closes; a connection that ends without a goodbye (end of stream, or
a reset) means the agent's process is gone, and the watcher knows it within one poll. An agent that
leaves the running job on purpose while the others go on (it excluded its own node: a straggler, or
silent data corruption) sends the leaving byte instead: gone now, with no bound to wait out, and the
watcher says it left rather than died. A host that
drops off the network sends nothing and closes nothing: its connection stays open and the heartbeat
bound decides. That bound is read from the same line: the agent sends a beat byte on every held
connection every half second (from its board's poll thread, before any store call), and a watcher
counts each line's quiet time since its last byte (:meth:`Watch.quiet`). So a silent host is found
by its bound whether or not any rank noticed, at the cost of one socket read per watched node per
poll on the watcher, and no store call at all.

The same connections carry nudges, both ways: a board that wrote the document sends one byte to the
agents it is connected to, and a watcher that read a new document passes one on to every line it
holds, so the other boards read it at once rather than at their next poll (launch/inplace/ticker.py).
A nudge only makes a board read the store sooner; what the store holds decides.

The address a watcher connects to is read from the round's worker store, sealed with the job key and
bound to the round's store (a planted address could otherwise make a healthy node look dead); a
connection refused or not made within ``connect_s`` is no verdict (the heartbeat decides). Every
call here returns at once (a dial completes on a later poll) and runs on the board's poll thread.
"""

from __future__ import annotations

import errno
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

GOODBYE = b"B"  # sent by an agent that closes its liveness line on purpose
BEAT = b"."  # sent every half second while the agent lives
LEAVING = b"X"  # sent by an agent that leaves the running job on purpose (its node excluded itself)
NUDGE = b"!"  # either way: "the board's document moved, read it now" (launch/inplace/ticker.py)
LIVE = "stalwart/inplace/live/"  # store key prefix: each node's sealed liveness address
MAX_WATCHERS = 1024  # connections a line holds (the first node and the spares watch; no more are needed)


class Line:
    """This agent's liveness listener: watchers connect and hold their connection."""

    def __init__(self, host: str) -> None:
        """Listen on ``host`` (the address other nodes reach this one at, as the peer store does:
        never every interface), on a port the kernel picks."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self._sock.setblocking(False)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []

    def accept(self) -> None:
        """Take the watchers that connected since the last call (never waits)."""
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if len(self._held) >= MAX_WATCHERS:  # a flood of connections: the newest are not held, and
                _goodbye(conn)  # are told goodbye first, so a watcher among them draws no verdict
                continue
            conn.setblocking(False)
            _no_delay(conn)
            self._held.append(conn)

    def beat(self) -> None:
        """One beat byte to every watcher (never waits: a watcher too slow to read misses one; a
        connection that fails is dropped)."""
        _send_all(self._held, BEAT)

    def nudge(self) -> None:
        """Tell every watcher the document moved (never waits; a connection that fails is dropped)."""
        _send_all(self._held, NUDGE)

    def fds(self) -> list[int]:
        return [c.fileno() for c in self._held]

    def drain(self, ready: set[int]) -> bool:
        """Read the watchers' connections in ``ready`` (they send only nudges): whether one nudged. A
        watcher that closed its end is dropped."""
        nudged = False
        for conn in [c for c in self._held if c.fileno() in ready]:
            try:
                data = conn.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if data:
                nudged = nudged or NUDGE in data
                continue
            conn.close()
            self._held.remove(conn)
        return nudged

    def close(self, leaving: bool = False) -> None:
        """Close on purpose: a goodbye to every watcher (those still in the listen queue too), then
        close (a dead process does neither); ``leaving``: the leaving byte instead, this agent leaves
        a job that goes on without it."""
        self.accept()
        for conn in self._held:
            _goodbye(conn, LEAVING if leaving else GOODBYE)
        self._held.clear()
        self._sock.close()


def _no_delay(sock: socket.socket) -> None:
    """Send each byte at once: Nagle's algorithm would hold a nudge behind a beat not yet acknowledged
    (the peer's delayed acknowledgement: up to 40 ms)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _send_all(held: list[socket.socket], word: bytes) -> None:
    """``word`` on each connection of ``held`` without waiting (a full buffer misses it); one that
    fails is closed and dropped from ``held``."""
    for conn in list(held):
        try:
            conn.send(word)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            conn.close()
            held.remove(conn)


def _goodbye(conn: socket.socket, word: bytes = GOODBYE) -> None:
    """Close a watcher's connection on purpose: the goodbye (or leaving) byte first (a close without
    one reads as a dead agent to the watcher)."""
    try:
        conn.send(word)
    except OSError:
        pass
    conn.close()


@dataclass
class _Held:
    sock: socket.socket
    goodbye: bool = False
    leaving: bool = False
    heard: float = -1.0  # when its last byte came (-1: none yet: its quiet is not counted)


@dataclass
class _Dialing:
    sock: socket.socket
    deadline: float


@dataclass
class Watch:
    """Connections to the watched agents' liveness lines, and which of them died, since when. Every
    call returns at once: a connection is dialled without waiting and checked on later polls."""

    clock: Callable[[], float]
    connect_s: float = 1.0  # a connection not made within this is no verdict; dialled again later
    _dialing: dict[str, _Dialing] = field(default_factory=dict)
    _held: dict[str, _Held] = field(default_factory=dict)
    _dead: dict[str, float] = field(default_factory=dict)  # node -> when its line ended without goodbye
    _left: dict[str, float] = field(default_factory=dict)  # node -> when it said it leaves the job
    _polled: float = -1.0  # when the lines were last read: quiet is counted up to then, not up to now
    _nudged: bool = False  # a watched agent's board wrote the document since :meth:`take_nudge`

    def connected(self, node: str) -> bool:
        """Whether ``node``'s line is held, being dialled, or already ended."""
        return node in self._held or node in self._dialing or node in self._dead or node in self._left

    def dial(self, node: str, address: str) -> bool:
        """Start a connection to ``node``'s line at ``address`` (``host:port``); False when the address
        is malformed or the dial fails at once (no verdict either way)."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            return False
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex((host, int(port)))
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            sock.close()
            return False
        self._dialing[node] = _Dialing(sock, self.clock() + self.connect_s)
        return True

    def poll(self) -> None:
        """Finish the dials that connected, drop those past their deadline, and read every held line
        without waiting: an end without a goodbye marks its node dead."""
        now = self._polled = self.clock()
        self._finish_dials(now)
        for node in list(self._held):
            self._read(node, now)

    def read(self, ready: set[int]) -> None:
        """Read the held lines among ``ready`` (descriptors a wait found readable), as :meth:`poll`."""
        now = self.clock()
        for node in [n for n, h in self._held.items() if h.sock.fileno() in ready]:
            self._read(node, now)

    def _read(self, node: str, now: float) -> None:
        held = self._held[node]
        try:
            data = held.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return  # open and quiet since the last poll (a silent host: its quiet time decides)
        except OSError:  # reset by the peer's kernel: its process is gone
            data = b""
        if data:
            held.heard = max(held.heard, now)
            held.goodbye = held.goodbye or GOODBYE in data
            held.leaving = held.leaving or LEAVING in data
            self._nudged = self._nudged or NUDGE in data
            return
        held.sock.close()
        del self._held[node]
        if held.leaving:
            self._left[node] = now
        elif not held.goodbye:
            self._dead[node] = now

    def take_nudge(self) -> bool:
        """Whether a watched agent nudged since the last call."""
        nudged, self._nudged = self._nudged, False
        return nudged

    def nudge(self) -> None:
        """Pass a nudge on to every watched agent (never waits)."""
        for held in self._held.values():
            try:
                held.sock.send(NUDGE)
            except OSError:  # a full buffer misses it; a reset is read as such by the next poll
                pass

    def fds(self) -> list[int]:
        return [h.sock.fileno() for h in self._held.values()]

    def _finish_dials(self, now: float) -> None:
        if not self._dialing:
            return
        # poll(2), not select(2): a first node of a large job holds more than 1,024 descriptors
        waiting = select.poll()
        for d in self._dialing.values():
            waiting.register(d.sock, select.POLLOUT)
        ready = {fd for fd, _ in waiting.poll(0)}
        for node, d in list(self._dialing.items()):
            if d.sock.fileno() in ready:
                del self._dialing[node]
                if d.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    _no_delay(d.sock)
                    self._held[node] = _Held(d.sock)
                else:
                    d.sock.close()  # refused: no verdict (the heartbeat decides; dialled again later)
            elif now >= d.deadline:
                del self._dialing[node]
                d.sock.close()

    def forget(self, node: str) -> None:
        """Drop all that is known of ``node``'s line (a node the group takes back runs a new agent,
        with a new line): its verdict, its connection; the next poll dials it afresh."""
        self._dead.pop(node, None)
        self._left.pop(node, None)
        for gone in (self._held.pop(node, None), self._dialing.pop(node, None)):
            if gone is not None:
                gone.sock.close()

    def quiet(self) -> dict[str, float]:
        """Seconds each held line had been quiet at the last poll (its agent beats every half second),
        for the lines that carried a byte: a line never heard from is not counted (the store's
        heartbeat decides). Up to the last poll, not to now: a poll thread that was not scheduled for
        a while has not read the beats waiting in its sockets, and that is no silence of theirs."""
        return {n: max(0.0, self._polled - h.heard) for n, h in self._held.items() if h.heard >= 0}

    def hosts(self) -> dict[str, str]:
        """Each held line's peer address (the watched node's host, as this host's kernel names it)."""
        out = {}
        for node, held in self._held.items():
            try:
                out[node] = str(held.sock.getpeername()[0]).removeprefix("::ffff:")
            except OSError:
                continue
        return out

    def dead(self) -> dict[str, float]:
        """Nodes whose agent process is gone, and when that was seen."""
        return dict(self._dead)

    def left(self) -> dict[str, float]:
        """Nodes whose agent left the job on purpose (the leaving byte), and when its line closed."""
        return dict(self._left)

    def close(self) -> None:
        for sock in [h.sock for h in self._held.values()] + [d.sock for d in self._dialing.values()]:
            sock.close()
        self._held.clear()
        self._dialing.clear()
