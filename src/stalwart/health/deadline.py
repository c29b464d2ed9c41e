"""Run a call with a deadline: NVML, stat() on a dead NFS mount and subprocesses can hang.

The call runs in a daemon thread; when the deadline passes we stop waiting and report
:class:`CallTimedOut`. The stuck thread is abandoned (a thread cannot be killed); being a daemon it
does not keep the process alive. A wedged driver therefore costs one leaked thread per check, which
is why the CLI runs each check in a short-lived process.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class CallTimedOut(Exception):
    """The call did not return before its deadline."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(f"{what} did not return within {timeout_s:g} s")
        self.what = what
        self.timeout_s = timeout_s


def call_with_timeout(fn: Callable[[], T], timeout_s: float, what: str = "call") -> T:
    """Return ``fn()`` or raise :class:`CallTimedOut`; exceptions of ``fn`` propagate."""
    box: dict[str, Any] = {}  # Any: fn's value (a T) or the exception it raised
    done = threading.Event()

    def runner() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc
        finally:
            done.set()

    t = threading.Thread(target=runner, name=f"deadline:{what}", daemon=True)
    t.start()
    if not done.wait(timeout_s):
        raise CallTimedOut(what, timeout_s)
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run a command with a timeout; raises CallTimedOut, FileNotFoundError or OSError."""
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CallTimedOut(" ".join(argv), timeout_s) from exc
