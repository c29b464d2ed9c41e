"""Live terminal output of a run: a progress line and each incident as it happens, every line
wrapped to the terminal's width (80 columns when piped) under the text after its clock time."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from typing import IO

from rich.console import Console
from rich.markup import escape as _markup

from ..account.startup import StartupWatch
from ..diagnose.incident import event_line
from ..diagnose.pyspy import STOPPED
from ..events import (
    AttemptStarted,
    ChaosInjected,
    DecisionTaken,
    Event,
    FailureDetected,
    IncidentRaised,
    JobEnded,
    JobStarted,
    ReformedInPlace,
    StackCaptured,
    StragglerCleared,
    StragglerDetected,
    TrainingResumed,
)
from ..events.checkpoint import CheckpointDamaged
from ..node_name import printable_name
from ..terminal import output_width, plural
from ..terminal import say as wrapped


def esc(text: str) -> str:
    """Text from outside (errors, paths, node names other processes wrote) made safe for the
    terminal: control characters shown as escapes, line by line (:func:`printable_name`, nothing
    cut), then rich markup escaped."""
    return _markup("\n".join(printable_name(line, limit=len(line)) for line in text.split("\n")))


class RunConsole:
    def __init__(self, *, quiet: bool = False, stream: IO[str] | None = None) -> None:
        out = stream or sys.stdout
        self.console = Console(file=out, width=output_width(out), highlight=False, soft_wrap=True)
        self.quiet = quiet
        self.tty = self.console.is_terminal
        self._last_print = 0.0
        self._last_pct = -1  # the last progress mark printed to a log (a tenth of the run, or 1-2-5)
        self._last_step = -1
        self._first: float | None = None  # when the first progress came (elapsed counts from there)
        self._line_open = False
        self._recovering: dict[str, float | str] = {}  # marks of the recovery under way (phases line)
        self._skipped: set[str] = set()  # in-place skip reasons already said (each once per job)
        self._startup = StartupWatch()  # where the time before the first step went (account/startup.py)
        self._stepped_attempt, self._stepped = -1, set[int]()  # the ranks that stepped in this attempt

    def _clear_line(self) -> None:
        if self._line_open:
            self.console.file.write("\r\x1b[2K")
            self._line_open = False

    def say(self, text: str, *, always: bool = False) -> None:
        """Print rich markup; every piece of text from outside (errors, paths) must be escaped."""
        if self.quiet and not always:
            return
        self._clear_line()
        wrapped(self.console, text, hang=None)

    def event(self, ev: Event) -> None:
        self._startup.seen(ev)
        t = time.strftime("%H:%M:%S", time.localtime(ev.ts))
        if isinstance(ev, JobStarted):
            self.say(
                f"[bold]{t} job started[/]: {esc(' '.join((ev.script, *ev.args)))} "
                f"({ev.nproc_per_node} proc/node, nodes {ev.min_nodes}:{ev.max_nodes}, "
                f"max restarts {ev.max_restarts})"
            )
        elif isinstance(ev, AttemptStarted):
            self.say(f"{t} attempt {ev.attempt}: world size {ev.world_size} on {ev.num_nodes} node(s)")
        elif isinstance(ev, TrainingResumed):
            self.say(f"{t} [green]resumed[/] at step {ev.step}")
        elif isinstance(ev, ReformedInPlace) and (ev.shrunk_from or ev.grown_from):
            self.say(resized_line(t, ev))
        elif isinstance(ev, ChaosInjected):
            self.say(f"{t} [magenta]chaos[/]: {esc(ev.detail)}")
        elif isinstance(ev, CheckpointDamaged):  # found by background verification, before a recovery
            aside = "set aside" if ev.set_aside else "not set aside"
            self.say(
                f"{t} [red bold]checkpoint damaged[/]: step {ev.step} in the {esc(ev.tier)} tier: "
                f"{esc(ev.reason)}; {aside}, {esc(ev.fallback)}"
            )
        elif isinstance(ev, FailureDetected):
            self._recovering = {"onset": ev.onset, "detected": ev.ts}
            lat = ev.ts - ev.onset
            where = (
                f"at step {ev.step}" if ev.step >= 0 else "(step unknown: no SDK or before the first step)"
            )
            when = f"detected {lat:.2f}s after onset" if lat >= 0.01 else "detected within one monitor tick"
            planned = f" [magenta](injected by the chaos plan: {esc(ev.injected)})[/]" if ev.injected else ""
            self.say(
                f"{t} [red bold]{ev.failure} detected[/]: rank {ev.rank} {where}: {esc(ev.evidence)}{planned} "
                f"[dim]({when})[/]"
            )
        elif isinstance(ev, StackCaptured):
            where = innermost_frame(ev.stack)
            stopped = " (the rank is stopped: state T)" if ev.stack.startswith(STOPPED) else ""
            self.say(
                f"{t}   stack of rank {ev.rank}{stopped} captured into the ledger; innermost: {esc(where)}"
            )
        elif isinstance(ev, (StragglerDetected, StragglerCleared)):
            self._straggler(t, ev)
        elif isinstance(ev, IncidentRaised):
            self.say(f"{t} [red]incident[/]: {esc(event_line(ev))}")
        elif isinstance(ev, DecisionTaken):
            self._decision(t, ev)
        elif isinstance(ev, JobEnded):
            colour = "green" if ev.exit_code == 0 else "red"
            self.say(
                f"[bold {colour}]{t} job ended ({ev.outcome}, exit {ev.exit_code})[/]: {esc(ev.verdict)}",
                always=True,
            )

    def _decision(self, t: str, ev: DecisionTaken) -> None:
        if ev.action.startswith("start_"):
            # how this attempt's workers started: warm (forked) or cold, and why (launch/processes/warm_pool.py)
            colour = "green" if ev.action == "start_warm" else "yellow"
            self.say(f"{t} [{colour}]workers started[/] {esc(ev.reason)}")
            if "decided" in self._recovering:
                self._recovering.update(started=ev.ts, path=ev.action.removeprefix("start_"))
        elif ev.action == "in_place_skipped":
            if ev.reason not in self._skipped:  # once per job: the same reason again says nothing new
                self._skipped.add(ev.reason)
                self.say(f"{t} [yellow]in place not taken[/]: {esc(ev.reason)}")
        else:
            if ev.action == "restart" and "detected" in self._recovering:
                self._recovering["decided"] = ev.ts
            colour = "yellow" if ev.action == "restart" else "red"
            self.say(f"{t} [{colour}]decision[/]: {esc(ev.reason)}")

    def _straggler(self, t: str, ev: StragglerDetected | StragglerCleared) -> None:
        if isinstance(ev, StragglerDetected):
            # the score of this rank (the evidence text names the worst rank, which may be another one)
            self.say(
                f"{t} [yellow]straggler[/]: rank {ev.rank} at step {ev.step}: {ev.score:.2f}x the fleet "
                f"median own-work time"
            )
        else:
            self.say(
                f"{t} straggler cleared: rank {ev.rank} back to {ev.score:.2f}x the fleet median at step {ev.step}"
            )

    def _recovered(self, now: float) -> None:
        """Once every rank of this node stepped after a restart: the path and the phases of that
        recovery (the report has the same per interruption, from the ledger, up to every rank's first
        step)."""
        r, self._recovering = self._recovering, {}
        onset, detected, decided, started = (float(r[k]) for k in ("onset", "detected", "decided", "started"))
        self.say(
            f"  recovered on the {r['path']} path {now - onset:.2f}s after the fault: detect "
            f"{detected - onset:.2f}s, stop and decide {decided - detected:.2f}s, re-form "
            f"{started - decided:.2f}s, start to first step {now - started:.2f}s"
        )

    def note(self, text: str) -> None:
        self.say(f"{time.strftime('%H:%M:%S')} {esc(text)}")

    def stepped(self, attempt: int, steps: Sequence[tuple[int, float, float]], ranks: int) -> None:
        """Steps of ``attempt`` completed, as (rank, start, end), of this node's ``ranks`` ranks: at the
        job's first step, where its start-up went; once every rank stepped after a restart, that
        recovery (the report's recovery table ends it there too)."""
        if not steps:
            return
        start = min(s for _, s, _ in steps)
        told = self._startup.first_step(attempt, start)
        if told is not None:
            self.say(f"{time.strftime('%H:%M:%S', time.localtime(start))} {esc(told)}")
        if self._stepped_attempt != attempt:
            self._stepped_attempt, self._stepped = attempt, set()
        for rank, _, end in sorted(steps, key=lambda s: s[2]):
            self._stepped.add(rank)
            if len(self._stepped) >= ranks and "started" in self._recovering:
                self._recovered(end)

    def progress(self, step: int, total: int, attempt: int, rate: float, *, now: float | None = None) -> None:
        """Steps done so far (``total`` 0: the script did not say how many it runs, as an unchanged
        script's hooks cannot), the attempt, the job's rate and the time since the first report."""
        now = time.time() if now is None else now
        if self.quiet:
            return
        if self._first is None:
            self._first = now
        line = progress_line(step, total, attempt, rate, now - self._first)
        if self.tty:
            if now - self._last_print < 0.2:
                return
            self._last_print = now
            self.console.file.write(f"\r\x1b[2K{_bar_line(line, step, total, self.console.width)}")
            self.console.file.flush()
            self._line_open = True
            return
        # a log: every tenth of the run when its length is known, else at 1, 2, 5, 10, 20, 50 ... steps;
        # and at least every 30 s while steps advance
        mark = int(10 * step / total) if total else _decade_mark(step)
        if mark != self._last_pct or (now - self._last_print > 30 and step != self._last_step):
            self._last_pct, self._last_print, self._last_step = mark, now, step
            wrapped(self.console, f"  {line}", hang=None)

    def close(self) -> None:
        self._clear_line()


def progress_line(step: int, total: int, attempt: int, rate: float, elapsed_s: float) -> str:
    """One progress line: no total, percent or rate where none is known (never ``?`` or ``-1%``)."""
    done = f"step {step}/{total} ({min(100, int(100 * step / total))}%)" if total else f"step {step}"
    speed = f"{rate:.1f} steps/s" if rate > 0 else "rate -"
    return f"{done}, attempt {attempt}, {speed}, {_elapsed(elapsed_s)} elapsed"


def _bar_line(line: str, step: int, total: int, width: int) -> str:
    """The progress line on a terminal, with a bar as wide as fits (up to 30 columns; none under 10
    or without a total), within the terminal's width less one column: a longer line would wrap,
    and the next update would clear only its last row."""
    cols = min(30, width - 1 - len(line) - 5) if total else 0
    if cols < 10:
        return f"  {line}"[: width - 1]
    done = int(cols * min(1.0, step / total))
    return f"  [{'#' * done}{'-' * (cols - done)}] {line}"


def _elapsed(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _decade_mark(step: int) -> int:
    """How many of 1, 2, 5, 10, 20, 50, 100 ... ``step`` has reached (a log line at each)."""
    mark, bound = 0, 1
    while step >= bound:
        mark += 1
        bound = bound * 5 // 2 if str(bound)[0] == "2" else bound * 2
    return mark


def innermost_frame(stack: str) -> str:
    """The innermost frame of the thread that matters: faulthandler's "Current thread" (the one that
    was interrupted; other threads, such as a checkpoint writer, come first), or in a py-spy dump of a
    stopped rank, the main thread's first frame (py-spy lists the innermost first)."""
    lines = stack.strip().splitlines()
    if any(ln.startswith("Current thread") for ln in lines) or not any(
        _PYSPY_THREAD.match(ln) for ln in lines
    ):
        start = next((i for i, ln in enumerate(lines) if ln.startswith("Current thread")), 0)
        frames = [ln.strip() for ln in lines[start:] if ln.strip().startswith("File")]
        return frames[0] if frames else "(no Python frame)"
    heads = [i for i, ln in enumerate(lines) if _PYSPY_THREAD.match(ln)]
    main = next((i for i in heads if lines[i].rstrip().endswith('"MainThread"')), heads[0])
    frame = lines[main + 1].strip() if main + 1 < len(lines) and lines[main + 1].startswith(" ") else ""
    return f"{frame} (py-spy)" if frame else "(no Python frame)"


_PYSPY_THREAD = re.compile(r'^Thread (0x)?[0-9a-fA-F]+ \(\w+\): ".*"$')


def resized_line(t: str, ev: ReformedInPlace) -> str:
    """The console's line for a group that shrank or grew in place."""
    if ev.shrunk_from:
        return (
            f"{t} [green]shrank in place[/] from {ev.shrunk_from} to {plural(ev.world_size, 'process', 'processes')}: the "
            f"surviving ranks kept their processes and the live state after step {ev.step}"
        )
    ranks = f"{ev.ranks[0]}-{ev.ranks[-1]}" if len(ev.ranks) > 1 else ", ".join(map(str, ev.ranks))
    return (
        f"{t} [green]grew back in place[/] from {ev.grown_from} to {plural(ev.world_size, 'process', 'processes')}: the "
        f"ranks kept their processes and a replica sent new rank {ranks} the live state after "
        f"step {ev.step} ({ev.bytes_moved / 2**20:.1f} MiB)"
    )
