"""Warm worker starts: a fork server that has already imported torch and the script's imports.

A cold restart pays, per worker, the interpreter start and ``import torch`` (about 2 s of CPU
each; four workers on two cores take ~14 s before the first step). The fork server is one process
per agent that imports those modules once and then forks a worker per request, so a replacement
worker starts in milliseconds with the imports already done. What stays per worker: running the
script from its top (model construction, ``init_process_group``, the checkpoint load).

How a worker becomes the agent's child. The server forks an intermediate child which forks the
worker and exits at once; the agent is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so the
orphaned worker is re-parented to the agent, which then waits for it like any child of its own
(``os.waitpid``): exit codes and signals are exact, and PDEATHSIG ties the worker to the agent
again once it is re-parented.

Forking is only safe from a single-threaded process: the server checks ``/proc/self/task`` before
every fork and refuses (the agent then falls back to a cold start, with the reason) if any import
started a thread. A server that dies, hangs (every request has a deadline) or fails a request
gives a ``ForkServerError``; the agent falls back to cold starts with that reason in the ledger.

Wire format: one JSON object per line each way on a Unix socket pair; the worker's inherited file
descriptors (its IPC pipe) travel with the request as SCM_RIGHTS.

This module is the agent's side (:class:`ForkServer`); what runs in the server process, and in each
worker between its fork and its script, is in ``forkserver_main.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import select
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...protocol.lifetime import become_subreaper

DEFAULT_PRELOAD = (
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.distributed",
    "torch.optim",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.nn.parallel",
    "numpy",
    "stalwart.train",
    "stalwart.train.session",  # what a Session imports lazily: the checkpoint engine, pydantic, sqlite
    "stalwart.checkpoint.engine",
    "stalwart.ledger",
    "stalwart.launch.processes.bootstrap",  # the bootstrap every warm worker runs before its script
    "setproctitle",
)


class ForkServerError(RuntimeError):
    """The warm path failed; the caller falls back to a cold start."""


def script_imports(script: str, module: bool) -> list[str]:
    """Top-level modules a script imports (parsed, not run), for the server to preload; and for each
    ``from M import a`` also ``M:a``: the server takes the attribute too, so a package that loads its
    parts on first access (transformers: ``from transformers import Trainer`` imports the trainer,
    accelerate and the model code only then, 5 s a restart on 2 cores) has them loaded once."""

    path: str | None = script
    if module:
        try:
            spec = importlib.util.find_spec(script)
        except (ImportError, ValueError):
            return []
        path = spec.origin if spec is not None else None
    if not path or not path.endswith(".py"):
        return []
    try:
        tree = ast.parse(Path(path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in _module_level(tree.body):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}:{a.name}" for a in node.names if a.name != "*")
    return list(dict.fromkeys(n for n in names if n != "__future__"))


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements run at import time: the module body and the bodies of its top-level ``if``/``try``
    blocks (``if __name__ == "__main__":`` included), not function or class bodies."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out.extend(_module_level(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            out.extend(_module_level(node.body + node.orelse + node.finalbody))
    return out


@dataclass(frozen=True)
class WarmStart:
    """What a request asks the server to start."""

    argv: tuple[str, ...]  # the script path (or module with ``-m``) and its arguments, no interpreter
    module: bool
    env: dict[str, str]
    cwd: str
    log: str = ""  # file for stdout and stderr; "" keeps the server's (the agent's) streams
    instrument: bool = False  # start through the worker bootstrap's observers (worker_boot.install)


class ForkServer:
    """The agent's handle on one fork-server process."""

    def __init__(
        self,
        python: str,
        preload: list[str],
        *,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 120.0,
        wait: bool = True,
        label: str = "",
    ) -> None:
        if not become_subreaper():
            raise ForkServerError(
                "this kernel does not let the agent adopt forked workers (PR_SET_CHILD_SUBREAPER)"
            )
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._buf = b""
        self._ready_timeout_s = ready_timeout_s
        self._ready = False
        self.preloaded: list[str] = []
        self.failed_imports: dict[str, str] = {}
        self.files: dict[str, float] = {}  # the script's own preloaded modules and their mtimes
        self.ready_s = 0.0
        self._started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                python,
                "-c",
                "from stalwart.launch.processes.fork_server_main import serve; serve()",
                str(child.fileno()),
                json.dumps(preload),
                label,  # not read: names the server in ps and /proc (e.g. its run directory)
            ],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) for the server's imports to finish; raise ForkServerError if it cannot serve."""
        if self._ready:
            return
        try:
            hello = self._reply(self._ready_timeout_s if timeout_s is None else timeout_s)
        except ForkServerError:
            self.close(grace_s=0.0)
            raise
        if not hello.get("ok"):
            self.close()
            raise ForkServerError(f"fork server did not start: {hello.get('error', 'no reason given')}")
        self.preloaded = hello.get("loaded", [])
        self.failed_imports = hello.get("failed", {})
        self.files = {str(k): float(v) for k, v in hello.get("files", {}).items()}
        self.ready_s = time.monotonic() - self._started
        self._ready = True

    # Any: a message of the fork server's JSON protocol (json.loads/json.dumps)
    def _reply(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"fork server gave no answer within {timeout_s:.0f}s")
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                continue
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ForkServerError(f"fork server exited (code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise ForkServerError(f"fork server sent garbage: {line[:80]!r}") from exc
        if not isinstance(reply, dict):
            raise ForkServerError(f"fork server sent garbage: {line[:80]!r}")
        return reply

    def spawn(
        self,
        start: WarmStart,
        *,
        fds: tuple[int, ...] = (),
        stdio: tuple[int, int] | None = None,
        timeout_s: float = 10.0,
    ) -> int:
        """Start one worker; return its pid (a child of this process once re-parented).

        ``fds`` are descriptors the worker keeps at the same numbers (its IPC pipe); ``stdio`` are
        the write ends that become its stdout and stderr (the agent's output pipes)."""
        if self.proc.poll() is not None:
            raise ForkServerError(f"fork server is gone (exit code {self.proc.returncode})")
        self.wait_ready()
        msg = (
            json.dumps(
                {
                    "argv": list(start.argv),
                    "module": start.module,
                    "env": start.env,
                    "cwd": start.cwd,
                    "log": start.log,
                    "instrument": start.instrument,
                    "fds": list(fds),
                    "stdio": stdio is not None,
                }
            ).encode()
            + b"\n"
        )
        try:
            socket.send_fds(self._sock, [msg], list(fds) + list(stdio or ()))
        except OSError as exc:
            raise ForkServerError(f"cannot reach the fork server: {exc}") from exc
        reply = self._reply(timeout_s)
        if not reply.get("ok"):
            raise ForkServerError(str(reply.get("error", "the fork server refused the request")))
        return int(reply["pid"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server (chaos: the warm path forced to fail); its workers are not its children."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self, grace_s: float = 2.0) -> None:
        """Stop the server (its idle state holds memory and a process)."""
        try:
            self._sock.close()
        except OSError:
            pass
        if grace_s <= 0 and self.proc.poll() is None:
            self.proc.kill()  # not waited for: reaped by subprocess's own clean-up or at this process's exit
            return
        if self.proc.poll() is None:
            try:
                self.proc.wait(grace_s)  # it exits when its socket closes
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
