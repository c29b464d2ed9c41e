"""Spawning, signalling and stopping the local worker processes (an actuator).

Workers start warm (forked from the agent's fork server, see ``warm.py``) or cold (a fresh
interpreter through ``subprocess.Popen``). Both give the same handle: ``poll``/``wait``/
``send_signal``/``pid``/``returncode``, the same output pipes and pumps, the same exit codes
(negative for a signal). A warm worker is the agent's child too (the agent is a child subreaper), so
the agent reaps it itself with ``waitpid``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol, TextIO

from typing_extensions import assert_never

from ...policy.label import Label
from ...protocol.private_paths import open_log
from .fork_server import ForkServerError
from .peer_errors import PeerErrorFilter


@dataclass(frozen=True)
class OutputRoute:
    """Where one worker's output goes. Everything goes to ``log_path`` (the run dir's log, for the
    traceback tail); torchrun's ``--redirects``/``--tee``/``--local-ranks-filter`` decide the console
    and the per-stream files under ``--log-dir``."""

    log_path: Path | None  # None: inherit the agent's stdout/stderr untouched
    console: tuple[bool, bool] = (True, True)  # (stdout, stderr) shown on the agent's console
    prefix: tuple[bool, bool] = (False, False)  # console lines carry "[<role><local rank>]:"
    stream_files: tuple[Path | None, Path | None] = (None, None)  # torchrun --log-dir files
    files_root: Path | None = None  # the --log-dir itself: the levels below it are ours, never links


@dataclass(frozen=True)
class WorkerSpec:
    local_rank: int
    global_rank: int
    env: dict[str, str]
    log_path: Path | None  # None: inherit the agent's stdout/stderr
    ipc_fd: int = -1  # the write end of the message pipe, passed to the worker
    route: OutputRoute | None = None
    role: str = "default"


class StartPath(Label):
    """How a group's workers started."""

    WARM = "warm"  # every worker forked from the fork server
    COLD = "cold"  # every worker a fresh interpreter
    MIXED = "mixed"  # the warm path failed part-way: the rest started cold

    @property
    def action(self) -> str:
        """The ledger's ``DecisionTaken`` action for the start (mixed counts as cold)."""
        match self:
            case StartPath.WARM:
                return "start_warm"
            case StartPath.COLD | StartPath.MIXED:
                return "start_cold"
            case _:
                assert_never(self)


class WorkerProc(Protocol):
    """A worker process handle: ``subprocess.Popen`` (cold) or :class:`ForkedProc` (warm)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


Stream = IO[bytes] | None  # a worker's stdout or stderr pipe (None: not piped)


class WarmSpawner(Protocol):
    """What starts a worker warm (``warm.WarmPool``): raises ``ForkServerError`` when it cannot."""

    def spawn(self, env: dict[str, str], fds: tuple[int, ...], stdio: tuple[int, int] | None) -> int: ...


class ForkedProc:
    """A warm worker: forked by the fork server, re-parented to (and reaped by) this process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                got, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not (or no longer) our child: it cannot be waited for
                self.returncode = 255
                return self.returncode
            if got:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # reaped ones are never signalled: their pid may be reused
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WorkerGroup:
    def __init__(
        self,
        argv: Sequence[str],
        specs: Sequence[WorkerSpec],
        *,
        sleep: Callable[[float], None] = time.sleep,
        warm: WarmSpawner | None = None,
    ) -> None:
        self.argv = list(argv)
        self.specs = list(specs)
        self.procs: dict[int, WorkerProc] = {}
        self.exit_times: dict[int, float] = {}
        self._logs: list[IO[bytes]] = []
        self._pumps: list[threading.Thread] = []
        self._sleep = sleep
        self._warm = warm
        self.warm_ranks: list[int] = []  # global ranks started warm
        self.cold_reason = "" if warm is not None else "warm start not offered"

    def _spawn(
        self, spec: WorkerSpec, fds: tuple[int, ...], piped: bool
    ) -> tuple[WorkerProc, Stream, Stream]:
        """Start one worker warm if offered and it works, else cold; return (proc, stdout, stderr)."""
        if self._warm is not None:
            pipes = (os.pipe(), os.pipe()) if piped else None
            try:
                pid = self._warm.spawn(spec.env, fds, (pipes[0][1], pipes[1][1]) if pipes else None)
            except ForkServerError as exc:
                self.cold_reason = str(exc)
                self._warm = None  # the rest of the group goes cold too
                for r, w in pipes or ():
                    os.close(r)
                    os.close(w)
            else:
                self.warm_ranks.append(spec.global_rank)
                if pipes is None:
                    return ForkedProc(pid), None, None
                os.close(pipes[0][1])
                os.close(pipes[1][1])
                return ForkedProc(pid), os.fdopen(pipes[0][0], "rb"), os.fdopen(pipes[1][0], "rb")
        if not piped:
            # spawned from the agent's main thread: the worker's PDEATHSIG is tied to this thread
            proc = subprocess.Popen(self.argv, env=spec.env, stdin=subprocess.DEVNULL, pass_fds=fds)
            return proc, None, None
        proc = subprocess.Popen(
            self.argv,
            env=spec.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=fds,
        )
        return proc, proc.stdout, proc.stderr

    @property
    def path(self) -> StartPath:
        """warm (every worker forked warm), cold, or mixed (the warm path failed part-way)."""
        if len(self.warm_ranks) == len(self.procs) and self.procs:
            return StartPath.WARM
        return StartPath.MIXED if self.warm_ranks else StartPath.COLD

    def start(self) -> list[int]:
        for spec in self.specs:
            self._start_one(spec)
        return [p.pid for p in self.procs.values()]

    def _start_one(self, spec: WorkerSpec) -> WorkerProc:
        route = spec.route or OutputRoute(spec.log_path)
        fds = (spec.ipc_fd,) if spec.ipc_fd >= 0 else ()
        if route.log_path is None:
            proc = self.procs[spec.global_rank] = self._spawn(spec, fds, piped=False)[0]
            return proc
        # every file opened before the worker starts: a refused one (a plant) starts nothing
        log = open(open_log(route.log_path), "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        extras = [self._stream_file(p, route.files_root) for p in route.stream_files]
        proc, out, err = self._spawn(spec, fds, piped=True)
        self.procs[spec.global_rank] = proc
        self._pump_streams(spec, route, log, (out, err), extras)
        return proc

    def _stream_file(self, path: Path | None, root: Path | None) -> IO[bytes] | None:
        if path is None:
            return None
        fh = open(open_log(path, root), "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(fh)
        return fh

    def replace(self, spec: WorkerSpec, reap_s: float) -> int:
        """In-place recovery: SIGKILL the process of ``spec.global_rank`` (dead, hung or stopped), reap
        it within ``reap_s``, and start ``spec`` in its place (warm when the fork server is offered).
        Returns the new pid; raises RuntimeError when the old process cannot be reaped in time."""
        rank = spec.global_rank
        old = self.procs.get(rank)
        if old is not None:
            try:
                old.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                old.wait(timeout=reap_s)
            except subprocess.TimeoutExpired:
                raise RuntimeError(
                    f"rank {rank} (pid {old.pid}) did not exit {reap_s:g}s after SIGKILL"
                ) from None
        self.exit_times.pop(rank, None)
        if rank in self.warm_ranks:
            self.warm_ranks.remove(rank)
        self.specs = [spec if s.global_rank == rank else s for s in self.specs]
        return self._start_one(spec).pid

    def _pump_streams(
        self,
        spec: WorkerSpec,
        route: OutputRoute,
        log: IO[bytes],
        pipes: tuple[Stream, Stream],
        extras: list[IO[bytes] | None],
    ) -> None:
        """One thread per stream copies it to the run's log, its --log-dir file and the console."""
        lock = threading.Lock()
        for i, (pipe, console) in enumerate(zip(pipes, (sys.stdout, sys.stderr), strict=True)):
            if pipe is None:
                continue
            extra = extras[i]
            prefix = f"[{spec.role}{spec.local_rank}]:".encode() if route.prefix[i] else b""
            t = threading.Thread(
                target=_pump,
                args=(pipe, log, lock, extra, console if route.console[i] else None, prefix),
                daemon=True,
                name=f"output-r{spec.global_rank}-{i}",
            )
            t.start()
            self._pumps.append(t)

    def poll(self) -> dict[int, int | None]:
        """Exit code per global rank (None while running); negative codes are signals."""
        now = time.time()
        out: dict[int, int | None] = {}
        for rank, p in self.procs.items():
            code = p.poll()
            if code is not None and rank not in self.exit_times:
                self.exit_times[rank] = now
            out[rank] = code
        return out

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def signal(self, sig: int, ranks: Sequence[int] | None = None) -> None:
        for rank, p in self.procs.items():
            if (ranks is None or rank in ranks) and p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def stop(self, grace_s: float) -> dict[int, int]:
        """SIGTERM everyone still running, SIGKILL after ``grace_s``; return final exit codes."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            self._sleep(0.02)
        self.signal(signal.SIGKILL)
        codes = {rank: p.wait() for rank, p in self.procs.items()}
        self.close()
        return codes

    def wait_all(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in self.procs.values()):
                return True
            self._sleep(0.02)
        return False

    def close(self) -> None:
        for t in self._pumps:  # the pipes close when the workers exit: bounded wait for the last lines
            t.join(timeout=1.0)
        self._pumps.clear()
        for fh in self._logs:
            fh.close()
        self._logs.clear()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def tail(path: Path | None, lines: int = 5) -> str:
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 4096))
        text = fh.read().decode(errors="replace")
    return "\n".join(text.strip().splitlines()[-lines:])


def _pump(
    pipe: IO[bytes],
    log: IO[bytes],
    lock: threading.Lock,
    extra: IO[bytes] | None,
    console: TextIO | None,
    prefix: bytes,
) -> None:
    """Copy a worker's stream line by line to its log, its --log-dir file and the console; a
    communication error's traceback (a survivor of another rank's death) only to the logs."""
    quiet = PeerErrorFilter()
    try:
        for line in iter(pipe.readline, b""):
            with lock:
                log.write(line)
                log.flush()
            if extra is not None:
                extra.write(line)
                extra.flush()
            if console is not None:
                console = _show(console, prefix, quiet.feed(line))
        if console is not None:
            _show(console, prefix, quiet.flush())
    except (OSError, ValueError):
        pass
    finally:
        pipe.close()


def _show(console: TextIO, prefix: bytes, lines: list[bytes]) -> TextIO | None:
    try:
        out = console.buffer if hasattr(console, "buffer") else None
        for line in lines:
            if out is not None:
                out.write(prefix + line)
            else:
                console.write((prefix + line).decode(errors="replace"))
        if out is not None and lines:
            out.flush()
    except (OSError, ValueError):
        return None  # the console went away; keep logging
    return console


def tail_lines(path: Path | None, lines: int = 5, match: str = "") -> str:
    """The last ``lines`` lines of a log; with ``match``, those from the last line holding it on."""
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 65536))
        text = fh.read().decode(errors="replace")
    rows = text.rstrip().splitlines()
    if match:
        starts = [i for i, row in enumerate(rows) if match in row]
        if starts:
            rows = rows[starts[-1] :]
    return "\n".join(rows[-lines:])


def ending_note(spec: WorkerSpec | None) -> str:
    """What the console says of how a failed rank's output ended, with where its whole log is: the
    log's last lines (from its last traceback on) where the rank's stderr does not reach the
    console (redirected, filtered out); where it does, the worker printed them there already, and
    the console points to them instead of printing the traceback twice. "" without a log."""
    log = spec.log_path if spec is not None else None
    shown = tail_lines(log, 8, match="Traceback (most recent call last)")
    if spec is None or not shown:
        return ""
    if spec.route is None or spec.route.console[1]:
        return f"rank {spec.global_rank}'s own output above shows how it ended (its log: {log})"
    return f"last lines of rank {spec.global_rank} (its log: {log}):\n{shown}"
