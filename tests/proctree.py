"""Processes of one test's own tree, so a test never acts on a process another test (or another
pytest-xdist worker) started. Importable from every test package, as ``netutil``."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (children, their children, ...), from /proc."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            kids = {int(x) for x in Path(f"/proc/{p}/task/{p}/children").read_text().split()}
        except OSError:
            continue
        todo.extend(kids - out)
        out |= kids
    return out


def cmdline(pid: int) -> str:
    """The process's command line as one string ("" once it is gone). A process that set its title
    shows the title here."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
