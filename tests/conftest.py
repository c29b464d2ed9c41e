"""Set-up shared by several test packages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import netutil


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (tests that need several: ``netutil``)."""
    return netutil.free_port()


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``scontrol`` and ``sinfo`` on PATH that only append their argv to the returned file.

    ``sinfo`` prints one idle node ``n1`` so read-backs after a drain find something. A test that
    must prove no Slurm command ran asserts the file does not exist.
    """
    bindir = tmp_path / "fake-slurm-bin"
    bindir.mkdir()
    record = tmp_path / "slurm-calls.txt"
    for tool, answer in (("scontrol", ""), ("sinfo", "n1|idle|none")):
        script = bindir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{record}"\necho "{answer}"\n')
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return record
