"""The node memory tier through the checkpoint engine, one process: a save is kept in the node's
memory and on a peer; a node that lost its memory restores from the peer; a bad peer copy falls
back to disk with the reason."""

from __future__ import annotations

import pytest
import torch

from stalwart.checkpoint.engine import CheckpointEngine
from stalwart.checkpoint.node_tier import HELD, OWN, NodeLink
from stalwart.checkpoint.peer_store import Peer, PeerClient, PeerStore
from stalwart.checkpoint.tiers import TierConfig
from stalwart.events import CheckpointCommitted, CheckpointLoaded, CheckpointRejected
from stalwart.events.checkpoint import PeerReplicated

pytestmark = pytest.mark.integration
SECRET = b"k" * 32


@pytest.fixture
def nodes(tmp_path):
    """Two nodes' memory directories and peer stores; this process plays node a."""
    stores = {}
    for n in ("a", "b"):
        (tmp_path / n / OWN).mkdir(parents=True, mode=0o700)
        stores[n] = PeerStore(
            node=n, held=tmp_path / n / HELD, own=tmp_path / n / OWN, host="127.0.0.1", secret=SECRET
        ).start()
    yield tmp_path, stores
    for s in stores.values():
        s.stop()


def _engine(tmp_path, stores, events):
    tiers = [
        TierConfig(name="memory", kind="memory", location=str(tmp_path / "a" / OWN), keep=1, node_local=True),
        TierConfig(name="local", kind="local", location=str(tmp_path / "disk")),
    ]
    link = NodeLink(
        node="a",
        peers=tuple(Peer(n, s.host, s.port) for n, s in stores.items()),
        held=tmp_path / "a" / HELD,
        client=PeerClient(SECRET, timeout_s=5),
    )
    return CheckpointEngine(tiers, sink=events.append, link=link)


def _state(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 8, generator=g), "b": torch.randn(8, generator=g)}


def _wipe(path):
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()


def test_a_node_that_lost_its_memory_restores_from_the_peer_and_a_bad_copy_falls_back(nodes):
    tmp_path, stores = nodes
    events: list = []
    eng = _engine(tmp_path, stores, events)
    saved = _state(1)
    eng.save(3, saved, {"rng": torch.tensor([7])}, force=True)
    eng.close()
    rep = [e for e in events if isinstance(e, PeerReplicated)]
    assert rep and rep[0].ok and rep[0].peer == "b" and rep[0].step == 3, rep
    assert (tmp_path / "b" / HELD / "a" / "step-000000003" / "MANIFEST.json").is_file()

    # a restart on the same node: its own memory tier
    events.clear()
    target = _state(2)
    found = _engine(tmp_path, stores, events).load_latest(target)
    assert found is not None and found.step == 3 and found.tier == "memory"
    assert all(torch.equal(target[k], saved[k]) for k in saved)

    # a replacement node: no memory; the peer's copy is fetched, verified and loaded
    _wipe(tmp_path / "a" / OWN)
    events.clear()
    target = _state(2)
    found = _engine(tmp_path, stores, events).load_latest(target)
    assert found is not None and found.step == 3 and found.tier == "peer"
    assert all(torch.equal(target[k], saved[k]) for k in saved)
    assert [e.tier for e in events if isinstance(e, CheckpointLoaded)] == ["peer"]
    assert found.rank_state["rng"].item() == 7

    # the peer's copy is corrupted: rejected with the reason, the disk copy of the same step loads
    _wipe(tmp_path / "a" / OWN)
    shard = next((tmp_path / "b" / HELD / "a" / "step-000000003").glob("__0_*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    events.clear()
    target = _state(2)
    found = _engine(tmp_path, stores, events).load_latest(target)
    assert found is not None and found.step == 3 and found.tier == "local"
    assert all(torch.equal(target[k], saved[k]) for k in saved)
    why = [e.reason for e in events if isinstance(e, CheckpointRejected)]
    assert why and "checksum" in why[0], why


def test_a_peer_that_is_gone_falls_back_to_disk_with_the_reason(nodes):
    tmp_path, stores = nodes
    events: list = []
    eng = _engine(tmp_path, stores, events)
    saved = _state(1)
    eng.save(4, saved, None, force=True)
    eng.close()
    _wipe(tmp_path / "a" / OWN)
    stores["b"].stop()
    events.clear()
    target = _state(2)
    found = _engine(tmp_path, stores, events).load_latest(target)
    assert found is not None and found.step == 4 and found.tier == "local"
    why = [e.reason for e in events if isinstance(e, CheckpointRejected)]
    assert why and "peer b" in why[0], why


def test_an_emergency_save_skips_the_node_memory_tier_that_goes_with_the_job(nodes):
    tmp_path, stores = nodes
    eng = _engine(tmp_path, stores, [])
    ticket = eng.save(6, _state(1), None, force=True, emergency=True)
    eng.close()
    assert ticket.tiers == ("local",)
    assert (tmp_path / "disk" / "step-000000006").is_dir()
    assert not (tmp_path / "a" / OWN / "step-000000006").exists()


def _save_losing_a_peer_in(collective: str, nodes, monkeypatch, step: int) -> list:
    """Save at ``step`` with the engine's collective ``collective`` failing as on a lost peer (its
    connections closed); the failure reaches the caller, and the events are returned."""
    tmp_path, stores = nodes
    events: list = []
    eng = _engine(tmp_path, stores, events)

    def lost(value: object) -> object:
        raise RuntimeError("Connection closed by peer [127.0.0.1]:29500")

    monkeypatch.setattr(eng.comm, collective, lost)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        eng.save(step, _state(1), {}, force=True)
        eng.close()
    return events


def test_a_peer_lost_during_the_copy_to_the_successor_leaves_the_commit_recorded(nodes, monkeypatch):
    """The copy to the successor node is collective: a peer lost during it (its collectives fail)
    must not cut the commit's record, which a restart that loads the version would otherwise lack
    (hog CI run 20: a group resumed from a version in node memory the ledger never saw committed)."""
    events = _save_losing_a_peer_in("all_gather_bool", nodes, monkeypatch, 3)
    committed = [e for e in events if isinstance(e, CheckpointCommitted)]
    assert [(e.step, e.tier) for e in committed] == [(3, "memory")], events
    assert (nodes[0] / "a" / OWN / "step-000000003" / "MANIFEST.json").is_file()
    assert not [e for e in events if isinstance(e, PeerReplicated)]


def test_a_peer_lost_after_rank_0_committed_leaves_the_commit_recorded(nodes, monkeypatch):
    """Rank 0 commits a file tier's version, then broadcasts the outcome: a peer lost in that
    broadcast leaves the version committed on disk, so its commit is recorded before the failure
    goes on (the node memory tier before it was committed and recorded as usual)."""
    events = _save_losing_a_peer_in("broadcast_str", nodes, monkeypatch, 4)
    committed = [e for e in events if isinstance(e, CheckpointCommitted)]
    assert [(e.step, e.tier) for e in committed] == [(4, "memory"), (4, "local")], events
    disk = nodes[0] / "disk" / "step-000000004"
    assert committed[1].path == str(disk) and (disk / "MANIFEST.json").is_file()
    assert committed[0].stall_s > 0 and committed[1].stall_s == 0.0  # the save's one stall, counted once
