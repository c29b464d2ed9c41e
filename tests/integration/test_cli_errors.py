"""Bad input gives one clear line on stderr, a non-zero exit, and never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "stalwart.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "train.py"
    p.write_text("print('hello')\n")
    return p


def _cases(tmp_path, script):
    garbage = tmp_path / "bad.ledger"
    garbage.write_bytes(b"\x00not a database" * 64)
    bad_yaml = tmp_path / "plan.yaml"
    bad_yaml.write_text("- {fault: crash, rank: one, step: 3}\n")
    bad_cfg = tmp_path / "run.yaml"
    bad_cfg.write_text("nproc_per_node: 2\nwarp_speed: 9\n")
    return {
        "unknown flag": (["run", "--frobnicate", str(script)], "No such option: --frobnicate"),
        "missing script": (["run", str(tmp_path / "nope.py")], "not found"),
        "bad fault spec": (["run", "--chaos", "crash@rank=1", str(script)], "needs step="),
        "unknown fault": (
            ["run", "--chaos", "explode@rank=1,step=2", str(script)],
            "unknown fault 'explode'",
        ),
        "bad fault yaml": (
            ["run", "--chaos-file", str(bad_yaml), str(script)],
            "rank='one' is not an integer",
        ),
        "bad nnodes": (["run", "--nnodes", "3:1", str(script)], "MIN <= MAX"),
        "timeout order": (
            ["run", "--hang-cap", "900", "--pg-timeout", "600", str(script)],
            "timeout order violated",
        ),
        "unknown config key": (
            ["run", "--config", str(bad_cfg), str(script)],
            "unknown setting(s) warp_speed",
        ),
        "unreadable ledger": (["report", str(garbage)], "not a Stalwart ledger"),
        "missing run dir": (["report", str(tmp_path / "missing")], "does not exist"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown flag",
        "missing script",
        "bad fault spec",
        "unknown fault",
        "bad fault yaml",
        "bad nnodes",
        "timeout order",
        "unknown config key",
        "unreadable ledger",
        "missing run dir",
    ],
)
def test_bad_input_is_one_clear_line(case, tmp_path, script):
    args, expected = _cases(tmp_path, script)[case]
    res = _cli(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("stalwart: error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in res.stderr + res.stdout
