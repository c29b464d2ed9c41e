"""The etcd rendezvous backend and store against a real etcd member (Debian's etcd-server) on
loopback: compare-and-swap on the state's revision, the store's operations under torch's PrefixStore,
failover to the next member, and a deadline on every request."""

from __future__ import annotations

import shutil

import pytest

from etcdutil import etcd_member
from netutil import free_ports
from stalwart.launch.rendezvous.etcd import EtcdClient, EtcdRendezvousBackend, EtcdStore, members

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("etcd") is None, reason="needs etcd (Debian: etcd-server)"),
]


@pytest.fixture
def etcd(tmp_path):
    with etcd_member(tmp_path / "etcd", name="mh-it") as endpoint:
        yield endpoint


def test_the_state_is_swapped_only_against_the_revision_it_was_read_at(etcd):
    backend = EtcdRendezvousBackend(EtcdClient(etcd), "job-a")
    assert backend.get_state() is None
    first = backend.set_state(b"round-0")
    assert first is not None and first[0] == b"round-0" and first[2] is True
    stale = backend.set_state(b"other", token=first[1] - 1)  # a writer that read an older state
    assert stale == (b"round-0", first[1], False)
    again = backend.set_state(b"also-new")  # "create" while the key exists: loses, returns the state
    assert again == (b"round-0", first[1], False)
    second = backend.set_state(b"round-1", token=first[1])
    assert second is not None and second[2] and second[1] > first[1]
    assert backend.get_state() == (b"round-1", second[1])
    assert EtcdRendezvousBackend(EtcdClient(etcd), "job-b").get_state() is None  # ids do not mix


def test_the_round_store_under_torchs_prefix_store(etcd):
    from torch.distributed import PrefixStore

    # the Python store must outlive the wrapper (torch's handler keeps it, as here)
    inner = EtcdStore(EtcdClient(etcd), "/t/store", timeout_s=2.0)
    store = PrefixStore("round.3", inner)
    store.set("master", "h0:4000")
    assert store.get("master") == b"h0:4000"
    assert store.check(["master"]) and not store.check(["missing"])
    assert store.add("joined", 1) == 1 and store.add("joined", 2) == 3
    assert store.compare_set("k", "", "v1") == b"v1"
    assert store.compare_set("k", "wrong", "v2") == b"v1"
    assert store.compare_set("k", "v1", "v2") == b"v2"
    with pytest.raises(Exception, match="not set within 2s"):
        store.get("never")


def test_a_dead_member_is_skipped_within_its_deadline(etcd):
    (dead,) = free_ports(1)  # nothing listens there: refused at once
    client = EtcdClient(f"127.0.0.1:{dead},{etcd}", request_s=1.0)
    client.put("/t/x", b"1")
    assert client.get("/t/x")[0] == b"1"
    with pytest.raises(Exception, match="no etcd member answered"):
        EtcdClient(f"127.0.0.1:{dead}", request_s=1.0).probe()
    assert members("a:1, http://b:2") == ["http://a:1", "http://b:2"]
