"""Every command's help fits an 80-column terminal, untruncated, with readable metavars."""

from __future__ import annotations

import contextlib
import io

import pytest

from stalwart import cli


def _paths(cmd, prefix=()):
    yield prefix
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _paths(sub, prefix + (name,))


COMMANDS = list(_paths(cli.command()))


def _help(argv: list[str], monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    assert code in (0, None, 2)
    return out.getvalue()


def test_every_command_is_walked():
    names = {" ".join(p) for p in COMMANDS}
    assert {"", "run", "report", "plan", "nodes", "health check"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "stalwart")
def test_help_fits_80_columns(path, monkeypatch):
    text = _help([*path, "--help"], monkeypatch)
    assert text.startswith("Usage: stalwart")
    too_wide = [ln for ln in text.splitlines() if len(ln) > 80]
    assert not too_wide, too_wide
    assert "…" not in text and "..." not in text.replace("]...", "").replace("ARGS]...", "")
    assert "<bool>" not in text and "<int>" not in text and "{" not in text.splitlines()[0]


def test_run_help_names_flags_whole(monkeypatch):
    text = _help(["run", "--help"], monkeypatch)
    assert "Usage: stalwart run [OPTIONS] SCRIPT [SCRIPT_ARGS]..." in text
    assert "--nproc-per-node, --nproc_per_node NPROC_PER_NODE" in text
    assert "--emergency-deadline EMERGENCY_DEADLINE" in text
    assert "--report / --no-report" in text


def test_bare_stalwart_prints_help_once(monkeypatch):
    text = _help([], monkeypatch)
    assert text.count("Usage: stalwart") == 1
    assert "run " in text and "report " in text
