"""Every flag of the installed torch's ``torchrun --help`` is a flag of ``stalwart run`` (both
spellings), and bad torchrun-style input is one clear line with exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from stalwart.cli import app
from stalwart.settings.panels import Panel


def _torchrun_flags() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    options = out.split("options:", 1)[1]
    flags = set()
    for line in options.splitlines():
        # option lines start with the flags: "  -r REDIRECTS, --redirects REDIRECTS"
        if re.match(r"^\s{2}-", line):
            flags.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", line))
    flags.discard("-h")
    flags.discard("--help")
    return {f for f in flags if not f.isupper()}


def _stalwart_run_flags() -> set[str]:
    cmd = typer.main.get_command(app).commands["run"]
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}


def test_stalwart_run_has_every_torchrun_flag():
    theirs = _torchrun_flags()
    assert {"--standalone", "--nproc-per-node", "--nproc_per_node", "-r", "--tee", "--node-rank"} <= theirs
    missing = sorted(theirs - _stalwart_run_flags())
    assert not missing, f"stalwart run lacks torchrun flags: {missing}"


def test_torchrun_flags_are_listed_together():
    """``stalwart run --help`` lists torchrun's own flags under one heading, and only them."""
    theirs = _torchrun_flags()
    cmd = typer.main.get_command(app).commands["run"]
    for p in cmd.params:
        opts = {*p.opts, *p.secondary_opts}
        if opts & theirs:
            assert p.rich_help_panel == Panel.TORCHRUN, (sorted(opts), p.rich_help_panel)
        elif p.param_type_name == "option" and p.rich_help_panel == Panel.TORCHRUN:
            raise AssertionError(f"{sorted(opts)} is not torchrun's but listed under {Panel.TORCHRUN}")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stalwart.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--no-such-flag", "S"], "No such option"),
        (["--tee", "7", "S"], "--tee '7' must be 0"),
        (["--redirects", "0:9", "S"], "--redirects '0:9' must be"),
        (["--nproc-per-node", "lots", "S"], "--nproc-per-node 'lots'"),
        (["--rdzv-backend", "zookeeper", "S"], "--rdzv-backend 'zookeeper' is not supported"),
        (["--start-method", "teleport", "S"], "--start-method 'teleport'"),
        (["--nnodes", "2", "S"], "--master-addr"),
        (["--run-path", "train.py"], "absolute path"),
        (["--signals-to-handle", "SIGNOPE", "S"], "unknown signal 'SIGNOPE'"),
        (["--rdzv-conf", "bogus=1", "S"], "unknown key 'bogus'"),
    ],
)
def test_bad_torchrun_input_is_one_clear_line(tmp_path: Path, args: list[str], fragment: str):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    p = _cli(*[str(script) if a == "S" else a for a in args], cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert fragment in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "never runs" not in p.stdout


def test_a_run_id_clashing_with_another_scripts_run_dir_is_exit_2(tmp_path: Path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("print('a ran')\n")
    b.write_text("print('b ran')\n")
    first = _cli("--run-id", "shared", "--no-health-gate", str(a), cwd=tmp_path)
    assert first.returncode == 0 and "a ran" in first.stdout, first.stdout + first.stderr
    second = _cli("--run-id", "shared", "--no-health-gate", str(b), cwd=tmp_path)
    assert second.returncode == 2 and "belongs to another run" in second.stderr, second.stderr
    assert "b ran" not in second.stdout and len(second.stderr.strip().splitlines()) == 1
