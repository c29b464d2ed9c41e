"""Every command's help fits an 80-column terminal, untruncated, with readable metavars."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from stalwart import cli
from stalwart.settings.panels import Panel
from stalwart.settings.run_config import SETTINGS


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


def _section(text: str, heading: str) -> str:
    """The lines of one help section: from its heading to the next unindented line."""
    lines = text.splitlines()
    start = lines.index(f"{heading}:") + 1
    end = next((i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith(" ")), None)
    return "\n".join(lines[start:end])


def test_run_help_lists_flags_under_their_panels_in_order(monkeypatch):
    text = _help(["run", "--help"], monkeypatch)
    headings = [f"{p.value}:" for p in Panel]
    places = [text.splitlines().index(h) for h in headings]  # each heading once, on its own line
    assert places == sorted(places)
    assert "--nproc-per-node" in _section(text, Panel.TORCHRUN.value)
    assert "--max-restarts" in _section(text, Panel.TORCHRUN.value)
    assert "--in-place-timeout" in _section(text, Panel.RECOVERY.value)
    assert "--chaos-file" in _section(text, Panel.CHAOS.value)
    assert "--notify-file" in _section(text, Panel.OBSERVABILITY.value)
    assert "--straggler-action" in _section(text, Panel.DIAGNOSIS.value)
    assert "--config CONFIG" in _section(text, Panel.RUN.value)
    assert "--hang-cap" not in _section(text, Panel.TORCHRUN.value)


def test_every_flag_of_run_has_a_panel():
    on_line = [leaf for leaf in SETTINGS.values() if leaf.setting.flags or leaf.setting.argument]
    assert all(leaf.panel is not None for leaf in on_line), [x.name for x in on_line if x.panel is None]


def test_run_help_marks_what_needs_the_sdk(monkeypatch):
    text = " ".join(_help(["run", "--help"], monkeypatch).split())  # help wrapped back to one line
    assert re.search(r"--in-place-max IN_PLACE_MAX [^[]*\(needs the SDK\)", text)
    assert re.search(r"--sdc-budget SDC_BUDGET [^[]*\(needs the SDK\)", text)
    assert re.search(r"--emergency-deadline EMERGENCY_DEADLINE [^[]*\(needs the SDK\)", text)
    assert not re.search(r"--hang-cap HANG_CAP [^[]*\(needs the SDK\)", text)
    assert not re.search(r"--chaos CHAOS [^[]*\(needs the SDK\)", text)


def test_run_help_shows_three_examples(monkeypatch):
    text = _help(["run", "--help"], monkeypatch)
    assert "  stalwart run --nproc-per-node 4 train.py --epochs 3\n" in text
    assert "--chaos-file faults.yaml train.py\n" in text
    assert "--rdzv-endpoint head-node:29400" in text


@pytest.mark.parametrize("argv", [["run", "--help"], ["metrics", "serve", "--help"]])
def test_model_spec_help_wraps_between_pairs(argv, monkeypatch):
    text = _help(argv, monkeypatch)
    words = set(text.split())
    for pair in ("params=7e9,", "head_dim=128,", "seq_len=4096,", "tokens_per_step=4e6,", "device=h100"):
        assert pair in words, (pair, text)


def test_root_help_says_where_to_start(monkeypatch):
    text = " ".join(_help(["--help"], monkeypatch).split())
    assert "Start here: stalwart demo (" in text
    assert "then stalwart run --nproc-per-node N train.py" in text
    assert "Docs: README.md" in text
