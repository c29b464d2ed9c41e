"""Node names and drain reasons are validated before any Slurm command runs or any path is built."""

import stat

import pytest

from stalwart.errors import ConfigError
from stalwart.events.node_health import NodeStateChanged
from stalwart.health.backends import SlurmBackend
from stalwart.health.node_store import HealthStore, local_node_name
from stalwart.node_name import validate_node_name

BAD = [
    "gpu[001-512]",
    "n1,n2,n3",
    "x State=RESUME",
    "../../x",
    "a/b",
    "$(touch f)",
    "`id`",
    "-h",
    "",
    ".",
    "..",
    "n1\n",
    "a" * 254,
    "a" * 64 + ".b",
    "NodeName=x",
]


@pytest.mark.parametrize("name", BAD)
def test_bad_names_never_reach_scontrol(name, fake_slurm):
    backend = SlurmBackend(timeout_s=5)
    for call in (
        lambda: backend.drain(name, "stalwart: xid 79"),
        lambda: backend.resume(name),
        lambda: backend.view(name),
    ):
        with pytest.raises(ConfigError):
            call()
    assert not fake_slurm.exists()


def test_a_good_name_does_reach_scontrol(fake_slurm):
    # the fake prints "n1|idle|none", so the read-back after the drain finds the node
    assert SlurmBackend(timeout_s=5).drain("n1", "stalwart: xid 79") == "idle"
    assert "scontrol update NodeName=n1 State=DRAIN Reason=stalwart: xid 79" in fake_slurm.read_text()


def test_control_characters_in_a_drain_reason_are_refused(fake_slurm):
    with pytest.raises(ConfigError, match="control characters"):
        SlurmBackend(timeout_s=5).drain("n1", "stalwart: a\nState=RESUME")
    assert not fake_slurm.exists()


@pytest.mark.parametrize("name", ["gpu017", "node-1.cluster.local", "n_1", "a" * 63, "1"])
def test_host_names_are_accepted(name):
    assert validate_node_name(name) == name


@pytest.mark.parametrize("name", ["../../x", "a/b", "gpu[1-2]"])
def test_bad_names_never_become_paths(name, tmp_path):
    state = tmp_path / "state" / "health"
    store = HealthStore(state)
    with pytest.raises(ConfigError):
        store.append(name, [_ev("n")])
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


def test_slurmd_nodename_is_validated(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "../../etc/x")
    with pytest.raises(ConfigError, match="SLURMD_NODENAME"):
        local_node_name()
    monkeypatch.setenv("SLURMD_NODENAME", "gpu17")
    assert local_node_name() == "gpu17"


def test_node_ledgers_are_private(tmp_path):
    store = HealthStore(tmp_path)
    store.append("n1", [_ev("n1")])
    mode = stat.S_IMODE((tmp_path / "node-n1.ledger").stat().st_mode)
    assert mode & 0o077 == 0


def _ev(node):
    return NodeStateChanged(
        ts=1.0, node=node, from_state="healthy", to_state="healthy", action="none", reason="ok"
    )
