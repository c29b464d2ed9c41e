"""Connection caps of the one HTTP server, over real loopback sockets: one source address cannot
hold more than its share of connections, and a client that is not authenticated (where the server
checks a signature, as the peer store does) never holds a slot that authenticated requests need.

Other sources are other loopback addresses (127.0.0.2, ...): the client socket is bound to one before
it connects. Every wait is bounded by a socket timeout; nothing is timed."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from stalwart.checkpoint.peer_store import AUTH, NONCE, PeerStore, request_headers, sign
from stalwart.http_server import MAX_CONNECTIONS, MAX_PER_SOURCE, HttpServer, Limits, Reply, Request

PARTIAL = b"GET / HTTP/1.1\r\nHost: x\r\n"  # headers that never end
SECRET = b"k" * 32


def ok(req: Request) -> Reply:
    return Reply.json(200, {"ok": True})


@contextlib.contextmanager
def served(srv: HttpServer) -> Iterator[HttpServer]:
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def connect(stack: contextlib.ExitStack, addr: tuple[str, int], source: str) -> socket.socket:
    s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    s.settimeout(10)
    s.bind((source, 0))
    s.connect(addr)
    return s


def hold(stack: contextlib.ExitStack, addr: tuple[str, int], source: str, n: int) -> list[socket.socket]:
    """``n`` connections from ``source``: every other one silent, the rest with unfinished headers."""
    socks = [connect(stack, addr, source) for _ in range(n)]
    for i, s in enumerate(socks):
        if i % 2:
            with contextlib.suppress(OSError):  # already refused: the server may have closed it
                s.sendall(PARTIAL)
    return socks


def refused_at_once(s: socket.socket) -> bool:
    """The server answered this connection 503 without a request (bounded by the socket timeout)."""
    try:
        return s.recv(4096).startswith(b"HTTP/1.1 503")
    except ConnectionResetError:  # answered and closed while our partial headers were unread
        return True
    except TimeoutError:
        return False


def get(addr: tuple[str, int], source: str, path: str = "/", headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection(*addr, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(), resp
    finally:
        conn.close()


def test_idle_connections_from_one_address_do_not_stop_another_from_being_served():
    with served(HttpServer(ok, limits=Limits(header_timeout_s=30))) as srv, contextlib.ExitStack() as stack:
        idle = hold(stack, srv.address, "127.0.0.1", MAX_CONNECTIONS + 8)  # more than the old cap
        assert get(srv.address, "127.0.0.2")[0] == 200
        # only one source's share was ever held: the rest were refused as they came
        refused = [refused_at_once(s) for s in idle[MAX_PER_SOURCE:]]
        assert all(refused)


def test_the_connection_over_one_sources_share_is_refused_at_once_while_another_is_served():
    limits = Limits(header_timeout_s=30)
    with served(HttpServer(ok, limits=limits)) as srv, contextlib.ExitStack() as stack:
        hold(stack, srv.address, "127.0.0.1", MAX_PER_SOURCE)
        extra = connect(stack, srv.address, "127.0.0.1")
        assert refused_at_once(extra)
        assert get(srv.address, "127.0.0.2")[0] == 200
        assert get(srv.address, "127.0.0.3")[0] == 200


def test_a_sources_slots_come_back_when_its_connections_leave():
    limits = Limits(header_timeout_s=30, max_per_source=2)
    with served(HttpServer(ok, limits=limits)) as srv:
        with contextlib.ExitStack() as stack:
            hold(stack, srv.address, "127.0.0.1", 2)
            assert get(srv.address, "127.0.0.1")[0] == 503
        for _ in range(50):  # the server sees the two leave shortly after we close them
            if get(srv.address, "127.0.0.1")[0] == 200:
                break
            threading.Event().wait(0.1)
        else:
            pytest.fail("the source's slots were not released")


# --- authentication before a request counts ---------------------------------------------------

TOKEN = "X-Token"


def token_server(max_connections: int, release: threading.Event) -> HttpServer:
    async def app(request: web.BaseRequest, size: int) -> web.StreamResponse:
        if request.path == "/stuck":
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)
        body = await request.content.readexactly(size) if size else b""
        return web.Response(status=200, body=b"ok:" + body)

    def authenticate(request: web.BaseRequest) -> web.StreamResponse | None:
        return None if request.headers.get(TOKEN) == "good" else web.Response(status=403)

    limits = Limits(header_timeout_s=30, handler_s=30, max_connections=max_connections)
    return HttpServer(stream=app, authenticate=authenticate, limits=limits)


def test_unauthenticated_requests_never_hold_the_slots_of_authenticated_ones():
    release = threading.Event()
    with served(token_server(2, release)) as srv, contextlib.ExitStack() as stack:
        # whole headers announcing a body that never comes: without the check first, each would
        # hold an admitted slot until the handler's deadline
        for i in range(6):
            s = connect(stack, srv.address, f"127.0.0.{10 + i}")
            s.sendall(b"PUT /x HTTP/1.1\r\nHost: x\r\nX-Token: bad\r\nContent-Length: 100\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 403")
        code, body, _ = get(srv.address, "127.0.0.2", headers={TOKEN: "good"})
        assert (code, body) == (200, b"ok:")
    release.set()


def test_the_admitted_cap_refuses_only_authenticated_requests_beyond_it():
    release = threading.Event()
    try:
        with served(token_server(1, release)) as srv:
            stuck = threading.Thread(target=get, args=(srv.address, "127.0.0.2", "/stuck", {TOKEN: "good"}))
            stuck.start()
            try:
                for _ in range(100):  # until the stuck request holds the one admitted slot
                    if srv.active_connections:
                        break
                    threading.Event().wait(0.05)
                assert get(srv.address, "127.0.0.3", headers={TOKEN: "good"})[0] == 503
                assert get(srv.address, "127.0.0.3", headers={TOKEN: "bad"})[0] == 403
            finally:
                release.set()
                stuck.join(30)
            assert get(srv.address, "127.0.0.3", headers={TOKEN: "good"})[0] == 200
    finally:
        release.set()


def test_unauthenticated_connections_held_open_do_not_stop_a_signed_peer_request(tmp_path):
    own = tmp_path / "own"
    (own / "step-000000005").mkdir(parents=True)
    (own / "step-000000005" / "rank-0.pt").write_bytes(b"state")
    store = PeerStore(
        node="b", held=tmp_path / "held", own=own, host="127.0.0.1", secret=SECRET, timeout_s=30
    )
    path = "/v1/f/5/rank-0.pt"
    with contextlib.ExitStack() as stack:
        stack.callback(store.stop)  # runs last: after every socket below is closed
        store.start()
        addr = (store.host, store.port)
        for i in range(5):  # five sources, each its full share: more than the old cap of 32
            hold(stack, addr, f"127.0.0.{20 + i}", MAX_PER_SOURCE)
        for i in range(4):  # and requests signed with another secret, announcing bodies
            s = connect(stack, addr, f"127.0.0.{30 + i}")
            bad = request_headers(b"w" * 32, "PUT", "/v1/h/a/1/rank-0.pt", "0" * 64)
            head = "".join(f"{k}: {v}\r\n" for k, v in bad.items())
            s.sendall(f"PUT /v1/h/a/1/rank-0.pt HTTP/1.1\r\nHost: x\r\n{head}".encode())
            s.sendall(b"X-Sha256: " + b"0" * 64 + b"\r\nContent-Length: 100\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 403")
        headers = request_headers(SECRET, "GET", path)
        code, body, resp = get(addr, "127.0.0.2", path, headers)
        assert (code, body) == (200, b"state")
        digest = resp.getheader("X-Sha256") or ""
        assert resp.getheader(AUTH) == sign(SECRET, "reply", "200", path, digest, headers[NONCE])
