"""The agent's node memory: a private tmpfs directory, peers and secret from the rendezvous store,
the workers' environment, and clean-up."""

from __future__ import annotations

import stat
import threading
from datetime import timedelta

import pytest
from torch.distributed import HashStore

from stalwart.checkpoint.node_memory import NodeMemory, peer_secret_from_key
from stalwart.checkpoint.peer_store import parse_peers
from stalwart.protocol import WorkerEnv


@pytest.fixture(autouse=True)
def shm(tmp_path, monkeypatch):
    monkeypatch.setenv("STALWART_SHM_DIR", str(tmp_path))
    monkeypatch.delenv("STALWART_CHECKPOINT_KEY", raising=False)
    monkeypatch.delenv("STALWART_CHECKPOINT_KEY_FILE", raising=False)
    return tmp_path


def test_two_agents_learn_each_other_and_share_the_round_secret_and_clean_up(monkeypatch):
    monkeypatch.setenv("STALWART_CHECKPOINT_KEY", "k" * 32)
    a = NodeMemory(run_id="r1", node="n0", host="127.0.0.1")
    b = NodeMemory(run_id="r1", node="n1", host="127.0.0.1")
    try:
        assert stat.S_IMODE(a.root.stat().st_mode) == 0o700
        store = HashStore()
        store.set_timeout(timedelta(seconds=20))
        t = threading.Thread(target=a.exchange, args=(store, 0, 2))  # each waits for the other's entry
        t.start()
        b.exchange(store, 1, 2)
        t.join(timeout=20)
        assert a.peers == b.peers and [p.node for p in a.peers] == ["n0", "n1"]
        assert a.secret == b.secret == peer_secret_from_key(b"k" * 32, "r1")
        assert a.store.secret == b.store.secret == a.secret  # started by exchange
        assert a.secret.hex().encode() not in b"".join(store.get(k) for k in store.list_keys())
        env = WorkerEnv(run_dir="d", run_id="r1", node="n1", attempt=0, **b.env())
        back = WorkerEnv.from_env(env.to_env())
        assert back is not None and parse_peers(back.peers) == b.peers
        assert bytes.fromhex(back.peer_secret) == b.secret and back.mem_dir == str(b.root)
    finally:
        a.close()
        b.close()
    assert not a.root.exists() and not b.root.exists() and not a.root.parent.exists()


def test_several_nodes_without_a_key_get_no_peer_store_and_are_told_how_to_set_one():
    a = NodeMemory(run_id="r6", node="n0", host="127.0.0.1")
    try:
        store = HashStore()
        a.exchange(store, 0, 2)  # returns at once: nothing to publish, no peer to wait for
        assert a.store is None and a.secret == b"" and store.list_keys() == []
        assert a.env()["peers"] == a.env()["peer_secret"] == ""
        assert "STALWART_CHECKPOINT_KEY_FILE" in a.notice and "openssl rand" in a.notice
    finally:
        a.close()


def test_with_a_checkpoint_key_the_secret_is_derived_and_never_published(monkeypatch):
    monkeypatch.setenv("STALWART_CHECKPOINT_KEY", "x" * 32)
    a = NodeMemory(run_id="r2", node="n0", host="127.0.0.1")
    try:
        store = HashStore()
        a.exchange(store, 0, 1)
        assert a.secret == peer_secret_from_key(b"x" * 32, "r2")
        assert a.secret.hex().encode() not in b"".join(store.get(k) for k in store.list_keys())
    finally:
        a.close()


def test_one_node_has_a_memory_tier_but_no_peer_store():
    a = NodeMemory(run_id="r3", node="solo", host=None)
    try:
        assert a.store is None and a.env()["peers"] == "" and a.env()["mem_dir"] == str(a.root)
    finally:
        a.close()


def test_a_version_is_found_in_the_node_memory_only_once_committed():
    a = NodeMemory(run_id="r4", node="solo", host=None)
    try:
        assert a.version_dir("step-000000001") is None
        (a.root / "ckpt" / "step-000000001").mkdir()
        assert a.version_dir("step-000000001") is None  # no manifest: not committed
        (a.root / "ckpt" / "step-000000001" / "MANIFEST.json").write_text("{}")
        assert a.version_dir("step-000000001") == a.root / "ckpt" / "step-000000001"
    finally:
        a.close()


def test_leftovers_of_a_killed_agent_are_removed_when_the_next_one_starts():
    a = NodeMemory(run_id="r5", node="solo", host=None)
    stale = a.root / "ckpt" / "step-000000009"
    stale.mkdir()  # as if the agent had been SIGKILLed and never cleaned up
    b = NodeMemory(run_id="r5", node="solo", host=None)
    try:
        assert b.root == a.root and not stale.exists()
    finally:
        b.close()
