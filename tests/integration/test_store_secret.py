"""Another local user who reaches the rendezvous store (torch's stores have no authentication) reads
every key in it, and finds nothing that opens a node's peer store."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from stalwart.checkpoint.node_memory import NodeMemory
from stalwart.checkpoint.peer_store import request_headers

pytestmark = pytest.mark.integration
SRC = str(Path(__file__).resolve().parents[2] / "src")
# uid 65534 has no account; CAP_DAC_READ_SEARCH only lets it load the root-owned virtualenv
AS_NOBODY = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=+dac_read_search",
    "--ambient-caps=+dac_read_search",
]
DUMP = """
import json, sys
from datetime import timedelta
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=10))
print(json.dumps({k: s.get(k).hex() for k in s.list_keys()}))
"""


def _dump_as_nobody(port: int) -> dict[str, bytes]:
    out = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", DUMP, str(port)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
        check=True,
    )
    return {k: bytes.fromhex(v) for k, v in json.loads(out.stdout).items()}


def _two_nodes(run_id: str) -> tuple[NodeMemory, NodeMemory, TCPStore]:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=20))
    a = NodeMemory(run_id=run_id, node="n0", host="127.0.0.1")
    b = NodeMemory(run_id=run_id, node="n1", host="127.0.0.1")
    t = threading.Thread(target=a.exchange, args=(server, 0, 2))
    t.start()
    b.exchange(TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=20)), 1, 2)
    t.join(20)
    return a, b, server


@pytest.fixture(autouse=True)
def shm(tmp_path, monkeypatch):
    monkeypatch.setenv("STALWART_SHM_DIR", str(tmp_path))
    monkeypatch.delenv("STALWART_CHECKPOINT_KEY", raising=False)
    monkeypatch.delenv("STALWART_CHECKPOINT_KEY_FILE", raising=False)


def test_without_a_key_the_store_carries_no_peer_secret_and_no_node_serves_peers():
    a, b, server = _two_nodes("sec-nokey")
    try:
        dumped = _dump_as_nobody(server.port)
        assert a.store is None and b.store is None and a.peers == b.peers == ()
        assert not any(len(v) in (32, 64) and "secret" in k for k, v in dumped.items()), dumped
        assert "openssl rand" in a.notice
    finally:
        a.close()
        b.close()


def test_with_a_key_nothing_read_from_the_store_opens_a_peer_store(monkeypatch, tmp_path):
    key = tmp_path / "key"
    key.write_text("9" * 64)
    key.chmod(0o600)
    monkeypatch.setenv("STALWART_CHECKPOINT_KEY_FILE", str(key))
    a, b, server = _two_nodes("sec-key")
    try:
        dumped = _dump_as_nobody(server.port)
        assert dumped["stalwart/peer/1"].decode() == f"n1={b.store.host}:{b.store.port}"  # it did read
        assert all(a.secret not in v and a.secret.hex().encode() not in v for v in dumped.values())
        for guess in [v for v in dumped.values()] + [
            bytes.fromhex(v.decode()) for v in dumped.values() if _hex(v)
        ]:
            path = "/v1/f/1/rank-0.pt"
            conn = http.client.HTTPConnection(b.store.host, b.store.port, timeout=5)
            conn.request("GET", path, headers=request_headers(guess, "GET", path))
            assert conn.getresponse().status == 403
            conn.close()
    finally:
        a.close()
        b.close()


def _hex(v: bytes) -> bool:
    try:
        bytes.fromhex(v.decode())
    except ValueError:
        return False
    return True
