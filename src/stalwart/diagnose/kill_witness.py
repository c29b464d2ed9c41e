"""The evidence about a worker's death by a signal, gathered where the agent runs.

- the memory cgroup's ``oom_kill`` count (cgroup v2 ``memory.events``, v1 ``memory.oom_control``)
  of the agent and of each worker, read when the attempt starts and again at a death;
- the kernel log (``/dev/kmsg``, read without blocking: nothing here waits) for the OOM killer's
  lines naming the PID;
- each worker's resident memory, sampled at most once a second while it runs;
- the last lines of the rank's log.

:meth:`KillWitness.verdicts` turns them into one :class:`~.kill_cause.KillVerdict` per rank killed
by a signal, with :func:`~.kill_cause.classify_kill`. When the kernel log is readable its lines
decide (the cgroup count also rises for a data-loader child or any other process in the cgroup);
when it is not (a container without CAP_SYSLOG), a rise of the count does.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from .kill_cause import KillEvidence, KillRules, KillVerdict, classify_kill, oom_lines_for

__all__ = ["KillWitness", "memory_counter_file", "read_kmsg", "read_oom_kills"]

_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4
_KMSG_MAX_RECORDS = 100_000  # the ring buffer holds far fewer; a bound on the loop all the same
RSS_EVERY_S = 1.0


def memory_counter_file(
    pid: int, proc: Path = Path("/proc"), root: Path = Path("/sys/fs/cgroup")
) -> Path | None:
    """The file holding the ``oom_kill`` count of ``pid``'s memory cgroup, or None."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.lstrip("/")
        if hid == "0" and controllers == "":  # cgroup v2: the unified hierarchy
            candidates += [root / rel / "memory.events", root / "unified" / rel / "memory.events"]
        elif "memory" in controllers.split(","):
            candidates.append(root / "memory" / rel / "memory.oom_control")
    return next((c for c in candidates if c.is_file() and read_oom_kills(c) is not None), None)


def read_oom_kills(path: Path) -> int | None:
    """The ``oom_kill`` count in a ``memory.events`` or ``memory.oom_control`` file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def read_kmsg(path: str = "/dev/kmsg") -> tuple[str, ...] | None:
    """The kernel ring buffer as ``[seconds] message`` lines (dmesg's form), or None if unreadable.
    Opened non-blocking: reading stops at the end of the buffer instead of waiting for more."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    out: list[str] = []
    try:
        for _ in range(_KMSG_MAX_RECORDS):
            try:
                rec = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while we read: go on with the next record
                    continue
                break  # EAGAIN: the end of the buffer
            if not rec:
                break
            head, _, msg = rec.decode(errors="replace").partition(";")
            fields = head.split(",")
            usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
            out.append(f"[{usec / 1e6:12.6f}] {msg.splitlines()[0] if msg else ''}")
    finally:
        os.close(fd)
    return tuple(out)


def _rss_kb(pid: int, proc: Path) -> int:
    try:
        return int((proc / str(pid) / "statm").read_text().split()[1]) * _PAGE_KB
    except (OSError, ValueError, IndexError):
        return -1


def _tail(path: Path | None, lines: int) -> tuple[str, ...]:
    if path is None:
        return ()
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ()
    return tuple(text.rstrip().splitlines()[-lines:])


class KillWitness:
    """One attempt's witness: baselines at start, evidence and verdicts at each death by a signal."""

    def __init__(
        self,
        pids: Iterable[int] = (),
        *,
        kernel_log: Callable[[], Iterable[str] | None] = read_kmsg,
        proc: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        rules: KillRules | None = None,
        injected_by: Callable[[int], str] = lambda pid: "",  # pid -> the chaos plan entry that killed it
    ) -> None:
        self._kernel_log = kernel_log
        self._injected_by = injected_by
        self._proc = proc
        self._rules = rules
        files = {memory_counter_file(p, proc, cgroup_root) for p in (os.getpid(), *pids)}
        self._baseline = {f: read_oom_kills(f) or 0 for f in files if f is not None}
        self._rss: dict[int, int] = {}
        self._rss_at = -float("inf")
        self._verdicts: dict[tuple[int, int], KillVerdict] = {}

    def sample(self, pids: Mapping[int, int], running: Iterable[int], now: float) -> None:
        """Resident memory of the running ranks (rank -> pid), at most every ``RSS_EVERY_S``."""
        if now - self._rss_at < RSS_EVERY_S:
            return
        self._rss_at = now
        for rank in running:
            kb = _rss_kb(pids[rank], self._proc)
            if kb >= 0:
                self._rss[rank] = kb

    def oom_kills(self) -> int:
        """How far the watched cgroups' oom_kill counts rose since the attempt started."""
        return sum(max(0, (read_oom_kills(f) or 0) - base) for f, base in self._baseline.items())

    def evidence(self, rank: int, pid: int, signum: int, log: Path | None = None) -> KillEvidence:
        kernel = self._kernel_log()
        lines = oom_lines_for(pid, kernel) if kernel is not None else ()
        rise = self.oom_kills() if kernel is None else 0
        return KillEvidence(
            rank=rank,
            pid=pid,
            signum=signum,
            oom_lines=lines,
            cgroup_oom_kills=rise,
            rss_kb=self._rss.get(rank, -1),
            log_tail=_tail(log, 5),
            injected=self._injected_by(pid),
        )

    def observe(
        self,
        pid_of: Callable[[int], int],
        codes: Mapping[int, int | None],
        logs: Mapping[int, Path | None],
        now: float,
    ) -> dict[int, KillVerdict]:
        """One supervisor tick: sample the running ranks, judge those killed by a signal (pids looked
        up live: a rank replaced in place is another process)."""
        pids = {r: pid_of(r) for r in codes}
        self.sample(pids, (r for r, c in codes.items() if c is None), now)
        return self.verdicts({r: c for r, c in codes.items() if c is not None and c < 0}, pids, logs)

    def verdicts(
        self, failed: Mapping[int, int], pids: Mapping[int, int], logs: Mapping[int, Path | None]
    ) -> dict[int, KillVerdict]:
        """A verdict for every rank in ``failed`` (rank -> exit code) that died by a signal, once each."""
        out: dict[int, KillVerdict] = {}
        for rank, code in failed.items():
            if code >= 0 or rank not in pids:
                continue
            key = (rank, pids[rank])  # a rank replaced in place is another process
            if key not in self._verdicts:
                v = classify_kill(self.evidence(rank, pids[rank], -code, logs.get(rank)), self._rules)
                if v is None:
                    continue
                self._verdicts[key] = v
            out[rank] = self._verdicts[key]
        return out
