"""Spawning, signalling and stopping the local worker processes (an actuator)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkerSpec:
    local_rank: int
    global_rank: int
    env: dict[str, str]
    log_path: Path | None  # None: inherit the agent's stdout/stderr


class WorkerGroup:
    def __init__(
        self, argv: Sequence[str], specs: Sequence[WorkerSpec], *, sleep: Callable[[float], None] = time.sleep
    ):
        self.argv = list(argv)
        self.specs = list(specs)
        self.procs: dict[int, subprocess.Popen] = {}
        self.exit_times: dict[int, float] = {}
        self._logs: list = []
        self._sleep = sleep

    def start(self) -> list[int]:
        for spec in self.specs:
            out = None
            if spec.log_path is not None:
                spec.log_path.parent.mkdir(parents=True, exist_ok=True)
                out = open(spec.log_path, "ab")  # noqa: SIM115 - closed in close()
                self._logs.append(out)
            # spawned from the agent's main thread: the worker's PDEATHSIG is tied to this thread
            self.procs[spec.global_rank] = subprocess.Popen(
                self.argv,
                env=spec.env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                stdin=subprocess.DEVNULL,
                pass_fds=(int(spec.env["STALWART_IPC"]),) if "STALWART_IPC" in spec.env else (),
            )
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
