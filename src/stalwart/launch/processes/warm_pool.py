"""Warm worker starts for the agent: one fork server per node, and the warm-or-cold decision.

The agent starts the fork server (``forkserver.py``) at job start: it imports torch, numpy, the SDK
and the script's own top-level imports once, with ``OMP_NUM_THREADS=1`` (forking is only safe from a
single-threaded process). Every attempt, the first as well as each restart, forks its workers from
it, so no worker pays the interpreter start and ``import torch`` again.

``choose_path`` is the policy (pure: what it is told in, a decision with a reason out). ``WarmPool``
is the actuator that owns the server process: it starts it, replaces it when it died or the script's
own modules changed on disk, forks workers from it, and stops it on every exit path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from typing_extensions import assert_never

from ...policy.label import Label
from .fork_server import DEFAULT_PRELOAD, ForkServer, ForkServerError, WarmStart, script_imports

SPAWN_TIMEOUT_S = 10.0  # one fork request; past it the attempt starts cold
READY_TIMEOUT_S = 120.0  # the server's imports; past it the attempt starts cold
MAX_SERVERS = 4  # servers started per job: one, plus replacements; then every start stays cold


class ServerState(Label):
    READY = "ready"  # started (its imports may still run: the start waits for them, bounded)
    DEAD = "dead"  # it failed to start or exited
    NONE = "none"  # none was started


@dataclass(frozen=True)
class ServerStatus:
    state: ServerState
    why: str = ""  # DEAD: why the server is not usable

    def __str__(self) -> str:
        """The text form: "ready", "dead: <why>" or "none"."""
        return f"dead: {self.why}" if self.state is ServerState.DEAD else self.state.value

    @classmethod
    def parse(cls, text: str) -> ServerStatus:
        """Read the text form back (anything not dead or none counts as ready)."""
        if text.startswith("dead"):
            return cls(ServerState.DEAD, text[5:].strip())
        return cls(ServerState.NONE) if text == "none" else cls(ServerState.READY)


@dataclass(frozen=True)
class PathChoice:
    warm: bool
    reason: str


def choose_path(
    *,
    enabled: bool,
    python_program: bool,
    server_state: ServerStatus | str,
    forced_failure: bool = False,
) -> PathChoice:
    """Warm or cold for the next start of the workers, and why.

    ``server_state``: the server's status, or its text form "ready" | "dead: <why>" | "none" (after
    the agent replaced a server that died or whose modules were edited, and waited, bounded, for its
    imports)."""
    if not enabled:
        return PathChoice(False, "warm start disabled (--no-warm)")
    if not python_program:
        return PathChoice(False, "--no-python: the workers are not a Python program the server can fork")
    if forced_failure:
        return PathChoice(True, "warm path forced to fail once (chaos): the fork server is killed first")
    status = server_state if isinstance(server_state, ServerStatus) else ServerStatus.parse(server_state)
    match status.state:
        case ServerState.DEAD:
            return PathChoice(False, f"fork server unavailable ({status.why or 'dead'})")
        case ServerState.NONE:
            return PathChoice(False, "no fork server")
        case ServerState.READY:
            return PathChoice(True, "forked from the fork server (torch and the script's imports preloaded)")
        case _:
            assert_never(status.state)


class WarmPool:
    """The agent's fork server: started once, replaced when it fails, closed on every exit path."""

    def __init__(
        self,
        *,
        python: str,
        script: str,
        module: bool,
        script_args: list[str],
        env: dict[str, str],
        cwd: str,
        label: str = "",
        instrument: bool = False,
    ) -> None:
        self.python = python
        self.instrument = instrument
        self.label = label
        self.script, self.module, self.script_args = script, module, list(script_args)
        self.cwd = cwd
        self.env = dict(env, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.preload = list(dict.fromkeys([*DEFAULT_PRELOAD, *script_imports(script, module)]))
        self.server: ForkServer | None = None
        self.failure = ""  # why the last server is not usable
        self.starts = 0

    def launch(self) -> None:
        """Start a fork server without waiting for its imports (they overlap with whatever runs)."""
        self.close()
        if self.starts >= MAX_SERVERS:
            if "staying cold" not in self.failure:
                self.failure = (
                    f"{self.starts} fork servers used up; staying cold (last: {self.failure or 'replaced'})"
                )
            return
        self.starts += 1
        try:
            self.server = ForkServer(self.python, self.preload, env=self.env, wait=False, label=self.label)
            self.failure = ""
        except (ForkServerError, OSError) as exc:
            self.server, self.failure = None, str(exc)

    def status(self) -> ServerStatus:
        if self.server is None:
            return (
                ServerStatus(ServerState.DEAD, self.failure)
                if self.failure
                else ServerStatus(ServerState.NONE)
            )
        if not self.server.alive():
            return ServerStatus(ServerState.DEAD, f"fork server exited (code {self.server.proc.returncode})")
        return ServerStatus(ServerState.READY)

    def state(self) -> str:
        """:meth:`status` in its text form ("ready", "dead: <why>", "none")."""
        return str(self.status())

    def changed(self) -> tuple[str, ...]:
        """The script's own preloaded modules edited since the server imported them."""
        if self.server is None or not self.server.files:
            return ()
        out: list[str] = []
        for path, mtime in self.server.files.items():
            try:
                if os.stat(path).st_mtime != mtime:
                    out.append(os.path.basename(path))
            except OSError:
                out.append(os.path.basename(path))
        return tuple(out)

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Wait (bounded) for the server's imports; "" when it can serve, else why not."""
        if self.server is None:
            return self.failure or "no fork server"
        try:
            self.server.wait_ready(timeout_s)
        except ForkServerError as exc:
            self.failure, self.server = str(exc), None
            if "thread" in self.failure and self.preload != list(DEFAULT_PRELOAD):
                # one of the script's own imports started a thread: serve without them
                self.preload = list(DEFAULT_PRELOAD)
                self.launch()
                return self.ready(timeout_s)
            return self.failure
        return ""

    def force_failure(self) -> None:
        """Chaos: kill the server so that the next warm start fails and the fallback runs."""
        if self.server is not None:
            self.server.kill()

    def spawn(self, env: dict[str, str], fds: tuple[int, ...], stdio: tuple[int, int] | None) -> int:
        if self.server is None:
            raise ForkServerError(self.failure or "no fork server")
        start = WarmStart(
            (self.script, *self.script_args), self.module, env, self.cwd, instrument=self.instrument
        )
        try:
            return self.server.spawn(start, fds=fds, stdio=stdio, timeout_s=SPAWN_TIMEOUT_S)
        except ForkServerError as exc:
            self.failure = str(exc)
            raise

    def close(self) -> None:
        """Stop the server at once: it holds no state worth a graceful exit, and an interpreter with
        torch loaded takes seconds to finalise on a busy machine, after the verdict is written."""
        if self.server is not None:
            self.server.close(grace_s=0.0)
            self.server = None
