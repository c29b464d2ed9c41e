"""The process-wide hooks a training process gets from its Session, and their undoing.

Installed (each only where it applies):

* under the agent, the parent-death signal: a worker orphaned by a killed agent must not keep a
  stale process group alive (and a worker whose agent is already gone exits at once);
* with a run directory, faulthandler on the agent's stack-dump signal, writing every thread's stack
  to this rank's stack file, and an excepthook that records an uncaught exception for the agent's
  restart policy before the previous hook prints it;
* handlers for the stop signals (SIGTERM, SIGUSR1): a stop request, not an exit.

:meth:`ProcessGuard.close` (or leaving ``with``) restores exactly what was installed: a hook that
someone replaced after us is left to them (our excepthook then only passes through). Faulthandler
keeps one registration per signal, so a registration made before ours on the stack-dump signal is
not brought back.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

from ..protocol import STACK_DUMP_SIGNAL, STOP_SIGNALS
from ..protocol.lifetime import EXIT_ORPHANED, die_with_parent, parent_death_signal, set_parent_death_signal

ErrorHook = Callable[[type[BaseException], BaseException, TracebackType | None], None]


class ProcessGuard:
    def __init__(
        self,
        *,
        on_signal: Callable[[int], None],
        on_error: ErrorHook | None = None,
        stack_file: Path | None = None,
        agent_pid: int | None = None,
    ) -> None:
        """``agent_pid``: tie this process to its agent (0: the agent's pid is unknown; None: no
        agent). ``stack_file`` and ``on_error`` need a run directory; None leaves them out."""
        self._on_signal = on_signal
        self._on_error = on_error
        self._stack_path = stack_file
        self._agent_pid = agent_pid
        self._stack: IO[str] | None = None
        # Any: signal.signal returns a handler, an int or None (typeshed's private _HANDLER)
        self._signals: dict[int, Any] = {}  # signal -> the handler before ours
        self._previous_hook: Callable[..., Any] | None = None  # Any: sys.excepthook's signature
        self._death_signal: int | None = None  # before ours; None: not set by us
        self._hook_active = False
        self.installed = False

    # --- install ------------------------------------------------------------------------------

    def install(self) -> ProcessGuard:
        if self.installed:
            return self
        self.installed = True
        try:
            self._install()
        except BaseException:  # e.g. signal handlers from a thread other than the main one: undo the rest
            self.close()
            raise
        return self

    def _install(self) -> None:
        if self._agent_pid is not None:
            self._tie_to_agent(self._agent_pid)
        if self._stack_path is not None:
            self._stack_path.parent.mkdir(parents=True, exist_ok=True)
            # private, as every file of the run (stacks name the script's code); kept open for
            # faulthandler, closed in close()
            fd = os.open(
                self._stack_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            os.fchmod(fd, 0o600)  # one left by an older attempt of this name keeps no wider mode
            self._stack = os.fdopen(fd, "w")
            faulthandler.register(STACK_DUMP_SIGNAL, file=self._stack, all_threads=True)
        if self._on_error is not None:
            self._previous_hook = sys.excepthook
            self._hook_active = True
            sys.excepthook = self._excepthook
        for sig in STOP_SIGNALS:
            self._signals[sig] = signal.signal(sig, self._handle)

    def _tie_to_agent(self, agent_pid: int) -> None:
        previous = parent_death_signal()
        if die_with_parent():
            self._death_signal = previous if previous is not None else 0
        if agent_pid and os.getppid() != agent_pid:
            os._exit(EXIT_ORPHANED)

    def reclaim_signals(self) -> None:
        """Put our stop-signal handlers back (a framework may install its own at fit start)."""
        for sig in STOP_SIGNALS:
            before = signal.signal(sig, self._handle)
            self._signals.setdefault(sig, before)

    # --- the hooks ----------------------------------------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._on_signal(signum)

    def _excepthook(self, etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if self._hook_active and self._on_error is not None:
            self._on_error(etype, value, tb)
        previous = self._previous_hook or sys.__excepthook__
        previous(etype, value, tb)

    # --- undo ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Restore what :meth:`install` changed; calling it again does nothing."""
        if not self.installed:
            return
        self.installed = False
        for sig, before in self._signals.items():
            if signal.getsignal(sig) == self._handle:  # still ours: else someone else's, left alone
                signal.signal(sig, before if before is not None else signal.SIG_DFL)
        self._signals.clear()
        if self._previous_hook is not None:
            self._hook_active = False
            if sys.excepthook == self._excepthook:
                sys.excepthook = self._previous_hook
        if self._stack is not None:
            faulthandler.unregister(STACK_DUMP_SIGNAL)
            self._stack.close()
            self._stack = None
        if self._death_signal is not None:
            set_parent_death_signal(self._death_signal)
            self._death_signal = None

    def __enter__(self) -> ProcessGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()
