"""Set-up shared by several test packages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import netutil


@pytest.fixture(scope="session", autouse=True)
def job_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One job key for every agent the suite starts (multi-node runs refuse to start without one), and
    a private config home, so no test makes ``~/.config/stalwart/job.key``. Every agent and worker
    inherits the environment."""
    home = tmp_path_factory.mktemp("config-home")
    home.chmod(0o700)
    key = home / "job.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(os.urandom(32).hex())
    os.environ.setdefault("STALWART_JOB_KEY_FILE", str(key))
    os.environ["XDG_CONFIG_HOME"] = str(home)
    return Path(os.environ["STALWART_JOB_KEY_FILE"])


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
