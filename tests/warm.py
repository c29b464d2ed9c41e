"""Trainer processes started warm, for tests that launch many short rank processes of a script.

Importing torch with its distributed, checkpoint and FSDP modules costs about 3 CPU seconds a
process, most of what a short checkpoint test spends on a 2-core machine. :func:`start` forks each
rank from a server process that imported those modules once (``multiprocessing``'s fork server, the
same idea as ``stalwart run``'s warm start), then runs the script as ``python script.py args`` would:
its own ``sys.argv``, ``sys.path[0]``, environment, ``__main__`` and exit handlers. Every rank is
still a real process with its own pid, sockets and signals; only the imports are shared.

Importable from every test package (``from warm import start``), as ``netutil``.
"""

from __future__ import annotations

import atexit
import importlib.util
import multiprocessing
import os
import runpy
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.context import ForkServerContext
from pathlib import Path

from proctree import cmdline, descendants

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torchdata.stateful_dataloader",
)

_CONTEXT: list[ForkServerContext] = []
_LOGS: list[Path] = []  # the ranks' output files of this test process, removed when it exits


def _log_dir() -> Path:
    if not _LOGS:
        _LOGS.append(Path(tempfile.mkdtemp(prefix="warm-ranks-")))
        atexit.register(shutil.rmtree, _LOGS[0], True)
    return _LOGS[0]


def forkserver() -> str:
    """Make ``multiprocessing``'s fork server the warm one, for tests that start their ranks with
    ``torch.multiprocessing.start_processes``: pass the returned ``start_method``."""
    _context()
    return "forkserver"


def _context() -> ForkServerContext:
    if not _CONTEXT:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([m for m in PRELOAD if importlib.util.find_spec(m.split(".")[0])])
        _CONTEXT.append(ctx)
    return _CONTEXT[0]


def _run_script(script: str, args: list[str], env: dict[str, str], out: str) -> None:
    """In the forked child: become ``python script args`` with ``env``, output into ``out``."""
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if env.get("OMP_NUM_THREADS", "").isdigit():  # read at import, which happened in the server
        import torch  # deferred: already imported by the server; only its thread count is set here

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as python does; the tests' path stays
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # what the interpreter does at exit; multiprocessing's child skips it
        sys.stdout.flush()
        sys.stderr.flush()


def server_cpu_s() -> float:
    """CPU seconds of this process's fork server and of the ranks it has reaped (0 before the first
    start): the ranks are its children, not ours, so ``getrusage`` does not see them."""
    if not _CONTEXT:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in descendants(os.getpid()):
        if "multiprocessing.forkserver" in cmdline(pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


class WarmProcess:
    """The part of :class:`subprocess.Popen` the tests use, for a rank forked warm."""

    def __init__(self, script: Path, args: list[str], env: dict[str, str]) -> None:
        fd, self._out = tempfile.mkstemp(prefix="rank-", suffix=".log", dir=_log_dir())
        os.close(fd)
        self._proc = _context().Process(
            target=_run_script, args=(str(script), list(args), dict(env), self._out)
        )
        self._proc.start()
        assert self._proc.pid is not None
        self.pid: int = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise TimeoutError(f"rank process {self.pid} still running after {timeout} s")
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> str:
        """Everything the rank wrote to stdout and stderr so far (its file goes when the test
        process exits, read or not)."""
        return Path(self._out).read_text(errors="replace")


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """This process's environment plus what torchrun gives rank ``rank`` of ``world`` (env://
    rendezvous on 127.0.0.1:``port``, one thread), and ``extra``."""
    return dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        **extra,
    )


def start(script: Path, args: list[str], env: dict[str, str]) -> WarmProcess:
    """Run ``script`` with ``args`` in a rank process forked warm, with exactly ``env``."""
    return WarmProcess(script, args, env)


def wait_all(procs: list[WarmProcess], timeout: float) -> list[tuple[int, str]]:
    """Each rank's exit code and output; ranks still running at the deadline are killed first."""
    deadline = time.monotonic() + timeout
    try:
        return [(p.wait(max(0.0, deadline - time.monotonic())), p.output()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)


def run(
    script: Path, args: list[str], env: dict[str, str] | None = None, timeout: float = 240
) -> tuple[int, str]:
    """One process of ``script`` forked warm, waited for: its exit code and output."""
    return wait_all([start(script, args, dict(os.environ) if env is None else env)], timeout)[0]
