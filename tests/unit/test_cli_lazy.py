"""A command line that names a command imports that one only (stalwart/cli.py): ``stalwart run`` is
every agent's start, and the simulator, the dashboard's server and the report are not its to import.
Anything else registers every command, so help and errors are as before."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from stalwart import cli

PROBE = """
import sys
import stalwart.cli as cli
cli._register_commands({argv!r})
import stalwart.serve.attach  # what `stalwart run` imports before its agent starts
heavy = sorted(m for m in sys.modules if m.startswith(("stalwart.sim", "stalwart.serve.dashboard", "aiohttp")))
print(sorted(cli._registered), heavy)
"""


def _probe(argv: list[str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


def test_a_named_command_imports_only_itself_and_nothing_of_the_simulator_or_the_http_server():
    assert _probe(["run", "--nproc-per-node", "2", "train.py"]) == "['run'] []"


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h", "run"], ["rnu"]])
def test_help_no_command_or_an_unknown_one_registers_every_command(argv):
    registered = _probe(argv).split("]")[0] + "]"
    assert {"run", "sim", "report", "dashboard", "plan"} <= set(ast.literal_eval(registered)), registered


def test_the_app_attribute_has_every_command():
    names = {c.name or (c.callback.__name__ if c.callback else "") for c in cli.app.registered_commands}
    groups = {g.name for g in cli.app.registered_groups}
    assert {"run", "sim", "report", "demo"} <= names and {"health", "metrics"} <= groups, (names, groups)
