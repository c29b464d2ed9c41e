"""The one HTTP server helper: loopback by default, body limit, connection cap, socket timeout, JSON
errors; and the serve-until-signal loop stops a server started with SIGINT ignored."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading

import pytest

from stalwart.errors import ConfigError
from stalwart.serve.httpd import HttpError, HttpServer, Limits, Reply, Request


def echo(req: Request) -> Reply:
    if req.path == "/boom":
        raise RuntimeError("kaput")
    if req.path == "/teapot":
        raise HttpError(418, "short and stout")
    return Reply.json(200, {"method": req.method, "target": req.target, "body": req.body.decode()})


@pytest.fixture
def server():
    srv = HttpServer(echo, limits=Limits(max_body=16, max_pending=2, header_timeout_s=30)).start()
    yield srv
    srv.stop()


def request(srv: HttpServer, method: str, path: str, body: bytes | None = None, headers=None):
    host, port = srv.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_loopback_and_any_free_port_by_default(server):
    host, port = server.address
    assert host == "127.0.0.1" and port > 0
    assert server.url("/x") == f"http://127.0.0.1:{port}/x"


def test_the_app_gets_method_target_and_body(server):
    code, headers, body = request(server, "POST", "/a?b=1", b"hello")
    assert code == 200
    assert json.loads(body) == {"method": "POST", "target": "/a?b=1", "body": "hello"}
    assert headers["Cache-Control"] == "no-store" and headers["X-Content-Type-Options"] == "nosniff"


def test_refusals_and_failures_are_one_line_json(server):
    code, _, body = request(server, "GET", "/teapot")
    assert code == 418 and json.loads(body) == {"error": "short and stout"}
    code, _, body = request(server, "GET", "/boom")
    assert code == 500 and json.loads(body)["error"] == "internal error: RuntimeError: kaput"


def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
    code, _, body = request(server, "POST", "/", b"x" * 17)
    assert code == 413 and "at most 16 bytes" in json.loads(body)["error"]
    code, _, body = request(server, "POST", "/", b"x", headers={"Content-Length": "many"})
    assert code == 400  # refused by aiohttp's parser before the application sees it


def test_connections_over_the_cap_get_503_at_once(server):
    # two clients that connect and send nothing hold both pending slots (until the 30 s timeout)
    idle = [socket.create_connection(server.address, timeout=10) for _ in range(2)]
    try:
        # the accept loop takes connections in order: the third one finds no slot
        code, _, body = request(server, "GET", "/")
        assert code == 503 and "too many connections" in json.loads(body)["error"]
    finally:
        for s in idle:
            s.close()
    # the slots come back when the idle clients leave
    for _ in range(50):
        if request(server, "GET", "/")[0] == 200:
            break
        threading.Event().wait(0.1)
    else:
        pytest.fail("the connection slots were not released")


def test_a_silent_client_is_dropped_after_the_header_timeout():
    srv = HttpServer(echo, limits=Limits(header_timeout_s=0.2)).start()
    try:
        with socket.create_connection(srv.address, timeout=10) as s:
            assert s.recv(1024) == b""  # closed by the server, not by our 10 s timeout
    finally:
        srv.stop()


def test_a_slowloris_client_is_dropped_at_the_header_deadline_while_another_is_served():
    # one header byte every 0.1 s: each read is quick (a per-read timeout never fires), the headers
    # never end; the server must drop it after its 1 s header deadline, well before the 300 bytes
    srv = HttpServer(echo, limits=Limits(header_timeout_s=1.0, max_connections=4)).start()
    trickle = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 300
    try:
        with socket.create_connection(srv.address, timeout=10) as slow:
            sent = 0
            served_meanwhile = False
            try:
                for byte in trickle:
                    slow.sendall(bytes([byte]))
                    sent += 1
                    if sent == 5:
                        served_meanwhile = request(srv, "GET", "/other")[0] == 200
                    threading.Event().wait(0.1)
                dropped = slow.recv(1024) == b""
            except (BrokenPipeError, ConnectionResetError):
                dropped = True
            assert served_meanwhile and dropped and sent < len(trickle)
    finally:
        srv.stop()


def test_a_handler_past_its_deadline_is_answered_503_and_others_are_still_served():
    release = threading.Event()

    def app(req: Request) -> Reply:
        if req.path == "/stuck":
            release.wait(30)  # a handler stuck on something (released when the test ends)
        return Reply.json(200, {"ok": True})

    srv = HttpServer(app, limits=Limits(handler_s=0.5)).start()
    try:
        code, _, body = request(srv, "GET", "/stuck")
        assert code == 503 and "not handled within" in json.loads(body)["error"]
        assert request(srv, "GET", "/fine")[0] == 200
    finally:
        release.set()
        srv.stop()


def test_a_busy_port_is_a_config_error_with_a_hint(server):
    with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
        HttpServer(echo, port=server.address[1])


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        Limits(max_connections=0)
    with pytest.raises(ValueError):
        Limits(max_pending=0)
    with pytest.raises(ValueError):
        Limits(max_per_source=0)


SERVE = """
from stalwart.serve.httpd import HttpServer, Reply, serve_until_signal
srv = HttpServer(lambda req: Reply(200, b"ok")).start()
serve_until_signal(
    lambda: (srv.stop(), print("stopped", flush=True)), ready=lambda: print(srv.url(), flush=True)
)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_until_signal_stops_even_with_sigint_ignored(sig):
    # a background job of a script inherits SIGINT ignored: `kill -INT` must still stop the server
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("http://127.0.0.1:")
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and out.strip() == "stopped"
