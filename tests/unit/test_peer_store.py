"""The peer store over loopback: authenticated, bounded, never trusting a peer's paths."""

from __future__ import annotations

import hashlib
import http.client
import socket
import time

import pytest

from stalwart.checkpoint.manifest import FileEntry, Manifest
from stalwart.checkpoint.peer_store import (
    DIGEST,
    WINDOW_S,
    Peer,
    PeerClient,
    PeerError,
    PeerStore,
    format_peers,
    parse_peers,
    request_headers,
)

SECRET = b"s" * 32


@pytest.fixture
def store(tmp_path):
    (tmp_path / "own").mkdir(mode=0o700)
    s = PeerStore(
        node="b",
        held=tmp_path / "held",
        own=tmp_path / "own",
        host="127.0.0.1",
        secret=SECRET,
        timeout_s=2.0,
        max_file_bytes=1000,
        max_total_bytes=1500,
    ).start()
    yield s
    s.stop()


def _peer(s: PeerStore) -> Peer:
    return Peer("b", s.host, s.port)


def _file(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p, hashlib.sha256(data).hexdigest()


def _manifest(tmp_path, step: int, files: dict[str, bytes]):
    m = Manifest(
        step=step,
        world_size=2,
        files={n: FileEntry(size=len(d), sha256=hashlib.sha256(d).hexdigest()) for n, d in files.items()},
        created=1.0,
    )
    return _file(tmp_path, "MANIFEST.json", m.to_json().encode())


def test_a_step_is_served_once_its_manifest_arrived_and_replaces_the_older_one(store, tmp_path):
    client = PeerClient(SECRET, timeout_s=2.0)
    data = b"shard-bytes"
    path, digest = _file(tmp_path, "__0_0.distcp", data)
    client.put(_peer(store), "a", 5, "__0_0.distcp", path, digest)
    with pytest.raises(PeerError, match="404"):  # not committed yet: no manifest
        client.get(_peer(store), 5, "__0_0.distcp", 100)
    mpath, mdigest = _manifest(tmp_path, 5, {"__0_0.distcp": data})
    client.put(_peer(store), "a", 5, "MANIFEST.json", mpath, mdigest)
    assert client.get(_peer(store), 5, "__0_0.distcp", 100) == data
    client.put(_peer(store), "a", 6, "__0_0.distcp", path, digest)
    mpath, mdigest = _manifest(tmp_path, 6, {"__0_0.distcp": data})
    client.put(_peer(store), "a", 6, "MANIFEST.json", mpath, mdigest)
    assert sorted(p.name for p in (tmp_path / "held" / "a").iterdir()) == ["step-000000006"]


def test_a_request_without_the_secret_is_refused_and_stores_nothing(store, tmp_path):
    path, digest = _file(tmp_path, "rank-0.pt", b"x" * 10)
    with pytest.raises(PeerError, match="403|not signed"):
        PeerClient(b"w" * 32).put(_peer(store), "a", 1, "rank-0.pt", path, digest)
    with pytest.raises(PeerError, match="not signed"):  # the refusal is signed with the real secret
        PeerClient(b"w" * 32).get(_peer(store), 1, "rank-0.pt", 100)
    assert not (tmp_path / "held" / "a").exists()


def _raw_put(store, path: str, headers: dict[str, str], body: bytes) -> int:
    conn = http.client.HTTPConnection(store.host, store.port, timeout=2)
    try:
        conn.request("PUT", path, body=body, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_recorded_request_cannot_be_replayed(store, tmp_path):
    body = b"shard"
    digest = hashlib.sha256(body).hexdigest()
    path = "/v1/h/a/1/rank-0.pt"
    headers = {**request_headers(SECRET, "PUT", path, digest), DIGEST: digest}
    assert _raw_put(store, path, headers, body) == 201
    (tmp_path / "held" / "a" / ".step-000000001.partial" / "rank-0.pt").unlink()
    assert _raw_put(store, path, headers, body) == 403  # the same nonce again
    assert not (tmp_path / "held" / "a" / ".step-000000001.partial" / "rank-0.pt").exists()


def test_a_request_signed_outside_the_time_window_is_refused(store):
    body = b"shard"
    digest = hashlib.sha256(body).hexdigest()
    path = "/v1/h/a/1/rank-0.pt"
    stale = time.time() - 2 * WINDOW_S
    assert (
        _raw_put(
            store, path, {**request_headers(SECRET, "PUT", path, digest, now=stale), DIGEST: digest}, body
        )
        == 403
    )
    fresh = {**request_headers(SECRET, "PUT", path, digest), DIGEST: digest}
    assert _raw_put(store, path, fresh, body) == 201


def test_oversize_bodies_are_refused_before_they_are_read(store, tmp_path):
    client = PeerClient(SECRET)
    big, digest = _file(tmp_path, "rank-0.pt", b"x" * 1001)
    with pytest.raises(PeerError, match="413|Broken|reset"):
        client.put(_peer(store), "a", 1, "rank-0.pt", big, digest)
    ok, digest = _file(tmp_path, "rank-1.pt", b"y" * 900)
    client.put(_peer(store), "a", 1, "rank-1.pt", ok, digest)
    more, digest = _file(tmp_path, "rank-2.pt", b"z" * 900)  # over the store's total
    with pytest.raises(PeerError, match="413|Broken|reset"):
        client.put(_peer(store), "a", 1, "rank-2.pt", more, digest)
    assert store.held_bytes() == 900


@pytest.mark.parametrize(
    "path",
    [
        "/v1/h/../1/rank-0.pt",
        "/v1/h/a/1/..%2F..%2Fx",
        "/v1/h/a/1/../../escape.pt",
        "/v1/h/a/1/passwd",
        "/v1/h/.hidden/1/rank-0.pt",
        "/v1/h/b/1/rank-0.pt",  # a peer cannot write as this node
        "/v1/h/a/-1/rank-0.pt",
    ],
)
def test_names_that_are_not_ours_are_refused_even_when_signed(store, tmp_path, path):
    body = b"evil"
    digest = hashlib.sha256(body).hexdigest()
    conn = http.client.HTTPConnection(store.host, store.port, timeout=2)
    conn.request(
        "PUT", path, body=body, headers={**request_headers(SECRET, "PUT", path, digest), DIGEST: digest}
    )
    assert conn.getresponse().status == 400
    conn.close()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == []


def test_a_body_that_does_not_match_its_digest_is_dropped(store, tmp_path):
    path, _ = _file(tmp_path, "rank-0.pt", b"data")
    with pytest.raises(PeerError, match="400"):
        PeerClient(SECRET).put(_peer(store), "a", 1, "rank-0.pt", path, "0" * 64)
    assert not any(p.is_file() for p in (tmp_path / "held").rglob("*"))


def test_a_silent_peer_costs_a_bounded_wait(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        peer = Peer("x", "127.0.0.1", silent.getsockname()[1])
        with pytest.raises(PeerError, match="timed out|TimeoutError"):
            PeerClient(SECRET, timeout_s=0.3).get(peer, 1, "rank-0.pt", 100)


def test_a_stalled_request_is_dropped_by_the_server(store):
    with socket.create_connection((store.host, store.port), timeout=10) as s:
        s.sendall(b"PUT /v1/h/a/1/rank-0.pt HTTP/1.1\r\n")  # and never the rest
        assert s.recv(100) == b"", "the server closed the connection after its timeout"


def test_the_store_refuses_every_interface(tmp_path):
    with pytest.raises(ValueError, match="every interface"):
        PeerStore(node="b", held=tmp_path / "h", own=tmp_path / "o", host="0.0.0.0", secret=SECRET)


def test_peer_lists_round_trip_and_bad_entries_are_refused():
    peers = (Peer("n0", "10.0.0.1", 1234), Peer("n1", "::1", 99))
    assert parse_peers(format_peers(peers)) == peers
    with pytest.raises(ValueError):
        parse_peers("../x=1.2.3.4:5")
