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


# what sinfo 22.05 printed on this machine with no slurm.conf and no configless DNS record
NO_CONFIG_STDERR = """sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host
sinfo: error: fetch_config: DNS SRV lookup failed
sinfo: error: _establish_config_source: failed to fetch config
sinfo: fatal: Could not establish a configuration source
"""


def failing(monkeypatch, stderr: str, calls: list | None = None) -> None:
    def run(argv, timeout_s):
        if calls is not None:
            calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 1, "", stderr)

    monkeypatch.setattr(backends, "run_command", run)


def test_no_slurm_configuration_says_so_instead_of_pointing_at_permissions(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    failing(monkeypatch, NO_CONFIG_STDERR)
    for call in (lambda be: be.list_nodes(), lambda be: be.drain("node2", "stalwart: x")):
        with pytest.raises(SchedulerError) as exc:
            call(SlurmBackend())
        err = exc.value
        assert err.message == (
            "no Slurm configuration found: sinfo: fatal: Could not establish a configuration source"
        )
        assert "SLURM_CONF" in err.hint and "--backend local" in err.hint
        assert "permission" not in str(err).lower() and "SlurmUser" not in str(err)


def test_a_slurm_conf_that_is_not_there_is_named_before_slurm_retries_it_for_a_minute(monkeypatch, tmp_path):
    calls: list = []
    failing(monkeypatch, "unreached", calls)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    with pytest.raises(SchedulerError, match=r"no Slurm configuration found: SLURM_CONF=.* is not a file"):
        SlurmBackend().list_nodes()
    assert calls == []  # sinfo never ran


@pytest.mark.parametrize(
    ("stderr", "hint"),
    [
        ("slurm_update error: Access/permission denied", "operator rights"),
        ("slurm_update error: Invalid node name specified", "sinfo -N"),
        ("slurm_update error: Unable to contact slurm controller (connect failure)", "scontrol ping"),
        (
            "scontrol: error: ClusterName needs to be specified\nscontrol: fatal: Unable to process "
            "configuration file",
            "fix the slurm.conf",
        ),
    ],
)
def test_each_failure_gets_the_hint_that_fits_it(monkeypatch, stderr, hint):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    failing(monkeypatch, stderr)
    with pytest.raises(SchedulerError) as exc:
        SlurmBackend().drain("node2", "stalwart: x")
    assert hint in exc.value.hint, exc.value
    assert "no Slurm configuration found" not in exc.value.message


def test_stalwart_nodes_passes_the_no_configuration_hint_on(monkeypatch, capsys, tmp_path):
    from stalwart import cli

    monkeypatch.delenv("SLURM_CONF", raising=False)
    failing(monkeypatch, NO_CONFIG_STDERR)
    with pytest.raises(SystemExit) as exc:
        cli.main(["nodes", "--backend", "slurm", "--state-dir", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no Slurm configuration found" in err and "set SLURM_CONF" in err, err
    assert "permission" not in err.lower(), err
