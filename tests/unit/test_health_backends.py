"""Slurm backend command lines, parsing and timeouts, with scontrol/sinfo replaced (no processes)."""

from __future__ import annotations

import subprocess

import pytest

import stalwart.health.backends as backends
from stalwart.errors import ConfigError, SchedulerError
from stalwart.health.backends import LocalBackend, SlurmBackend, make_backend
from stalwart.health.deadline import CallTimedOut

SINFO = "node1|idle|none\nnode2|drained|stalwart: fail: Xid 48 on gpu0\nnode3|draining|maintenance\nnode1|idle|none\n"


def fake(monkeypatch, outputs: dict[str, tuple[int, str]], calls: list):
    def run(argv, timeout_s):
        calls.append(list(argv))
        for key, (rc, out) in outputs.items():
            if argv[0] == key:
                return subprocess.CompletedProcess(argv, rc, out, "boom" if rc else "")
        raise AssertionError(argv)

    monkeypatch.setattr(backends, "run_command", run)


def test_list_and_view(monkeypatch):
    calls: list = []
    fake(monkeypatch, {"sinfo": (0, SINFO)}, calls)
    be = SlurmBackend()
    assert [(n.node, n.state, n.reason) for n in be.list_nodes()] == [
        ("node1", "idle", ""),
        ("node2", "drained", "stalwart: fail: Xid 48 on gpu0"),
        ("node3", "draining", "maintenance"),
    ]
    v = be.view("node3")
    assert v.drained and v.reason == "maintenance"
    assert calls[-1] == ["sinfo", "-h", "-N", "-n", "node3", "-o", "%N|%T|%E"]


def test_drain_and_resume_command_lines(monkeypatch):
    calls: list = []
    fake(monkeypatch, {"scontrol": (0, ""), "sinfo": (0, SINFO)}, calls)
    be = SlurmBackend()
    assert be.drain("node2", "stalwart: x y") == "drained"
    assert calls[0] == ["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=stalwart: x y"]
    be.resume("node2")
    assert ["scontrol", "update", "NodeName=node2", "State=RESUME"] in calls


def test_errors_and_timeouts_are_scheduler_errors(monkeypatch):
    fake(monkeypatch, {"scontrol": (1, ""), "sinfo": (0, SINFO)}, [])
    with pytest.raises(SchedulerError, match="exit 1"):
        SlurmBackend().drain("node2", "stalwart: x")
    with pytest.raises(SchedulerError, match="does not know node"):
        SlurmBackend().view("node9")
    with pytest.raises(SchedulerError, match="needs a reason"):
        SlurmBackend().drain("node2", "  ")

    def hang(argv, timeout_s):
        raise CallTimedOut(argv[0], timeout_s)

    monkeypatch.setattr(backends, "run_command", hang)
    with pytest.raises(SchedulerError, match="did not answer within 10 s"):
        SlurmBackend().list_nodes()


def test_missing_binary(monkeypatch):
    def missing(argv, timeout_s):
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(backends, "run_command", missing)
    with pytest.raises(SchedulerError, match="cannot run sinfo"):
        SlurmBackend().list_nodes()


def test_make_backend():
    assert isinstance(make_backend("local"), LocalBackend)
    assert make_backend("local").view("x") is None
    with pytest.raises(ConfigError):
        make_backend("k8s")
