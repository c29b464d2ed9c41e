"""Spawning, signalling and stopping the local worker processes (an actuator)."""

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


@dataclass(frozen=True)
class OutputRoute:
    """Where one worker's output goes. Everything goes to ``log_path`` (the run dir's log, for the
    traceback tail); torchrun's ``--redirects``/``--tee``/``--local-ranks-filter`` decide the console
    and the per-stream files under ``--log-dir``."""

    log_path: Path | None  # None: inherit the agent's stdout/stderr untouched
    console: tuple[bool, bool] = (True, True)  # (stdout, stderr) shown on the agent's console
    prefix: tuple[bool, bool] = (False, False)  # console lines carry "[<role><local rank>]:"
    stream_files: tuple[Path | None, Path | None] = (None, None)  # torchrun --log-dir files


@dataclass(frozen=True)
class WorkerSpec:
    local_rank: int
    global_rank: int
    env: dict[str, str]
    log_path: Path | None  # None: inherit the agent's stdout/stderr
    ipc_fd: int = -1  # the write end of the message pipe, passed to the worker
    route: OutputRoute | None = None
    role: str = "default"


class WorkerGroup:
    def __init__(
        self, argv: Sequence[str], specs: Sequence[WorkerSpec], *, sleep: Callable[[float], None] = time.sleep
    ):
        self.argv = list(argv)
        self.specs = list(specs)
        self.procs: dict[int, subprocess.Popen] = {}
        self.exit_times: dict[int, float] = {}
        self._logs: list = []
        self._pumps: list[threading.Thread] = []
        self._sleep = sleep

    def start(self) -> list[int]:
        for spec in self.specs:
            route = spec.route or OutputRoute(spec.log_path)
            fds = (spec.ipc_fd,) if spec.ipc_fd >= 0 else ()
            if route.log_path is None:
                # spawned from the agent's main thread: the worker's PDEATHSIG is tied to this thread
                self.procs[spec.global_rank] = subprocess.Popen(
                    self.argv, env=spec.env, stdin=subprocess.DEVNULL, pass_fds=fds
                )
                continue
            route.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(route.log_path, "ab")  # noqa: SIM115 - closed in close()
            self._logs.append(log)
            lock = threading.Lock()
            proc = subprocess.Popen(
                self.argv,
                env=spec.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=fds,
            )
            self.procs[spec.global_rank] = proc
            for i, (pipe, console) in enumerate(((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))):
                extra = None
                if route.stream_files[i] is not None:
                    route.stream_files[i].parent.mkdir(parents=True, exist_ok=True)
                    extra = open(route.stream_files[i], "ab")  # noqa: SIM115 - closed in close()
                    self._logs.append(extra)
                prefix = f"[{spec.role}{spec.local_rank}]:".encode() if route.prefix[i] else b""
                t = threading.Thread(
                    target=_pump,
                    args=(pipe, log, lock, extra, console if route.console[i] else None, prefix),
                    daemon=True,
                    name=f"output-r{spec.global_rank}-{i}",
                )
                t.start()
                self._pumps.append(t)
        return [p.pid for p in self.procs.values()]

    def poll(self) -> dict[int, int | None]:
        """Exit code per global rank (None while running); negative codes are signals."""
        now = time.time()
        out = {}
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


def _pump(pipe, log, lock: threading.Lock, extra, console, prefix: bytes) -> None:
    """Copy a worker's stream line by line to its log, its --log-dir file and the console."""
    try:
        for line in iter(pipe.readline, b""):
            with lock:
                log.write(line)
                log.flush()
            if extra is not None:
                extra.write(line)
                extra.flush()
            if console is not None:
                try:
                    out = console.buffer if hasattr(console, "buffer") else None
                    if out is not None:
                        out.write(prefix + line)
                        out.flush()
                    else:
                        console.write((prefix + line).decode(errors="replace"))
                except (OSError, ValueError):
                    console = None  # the console went away; keep logging
    except (OSError, ValueError):
        pass
    finally:
        pipe.close()


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
