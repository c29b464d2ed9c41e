"""The one HTTP server under the dashboard, the notification receiver and the metrics endpoint.

Standard library only (``ThreadingHTTPServer``). Everything a server exposed to a network must bound
is decided here, once: the loopback default, a per-socket timeout (a silent or trickling client is
dropped instead of holding a thread), a cap on concurrent connections (one more is answered 503 at
once), and a body limit (a larger ``Content-Length`` is answered 413 before a byte of the body is
read). An application is a function from a :class:`Request` to a :class:`Reply`; it raises
:class:`HttpError` for a 4xx, and any other exception becomes a 500 with a one-line JSON ``error``,
never a stack trace page. Every reply carries ``Cache-Control: no-store`` and ``nosniff``.

:func:`serve_until_signal` is the foreground loop of the ``serve`` commands.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn
from urllib.parse import urlsplit

from ..errors import ConfigError
from . import LOOPBACK

JSON = "application/json"


@dataclass(frozen=True)
class Limits:
    """What one server allows a client: seconds per socket read/write, concurrent connections, body bytes."""

    timeout_s: float = 15.0
    max_connections: int = 32
    max_body: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.max_connections < 1 or self.max_body < 0:
            raise ValueError(f"invalid HTTP limits: {self}")


@dataclass(frozen=True)
class Request:
    method: str  # GET | POST
    target: str  # the request target as sent: path and query
    headers: Message = field(default_factory=Message)
    body: bytes = b""

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


@dataclass(frozen=True)
class Reply:
    code: int
    body: bytes
    content_type: str = JSON

    @classmethod
    def json(cls, code: int, obj: Any) -> Reply:
        return cls(code, json.dumps(obj, default=str).encode())


class HttpError(Exception):
    """A refusal with its status code; the client gets ``{"error": message}``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


App = Callable[[Request], Reply]


def content_length(headers: Message, limit: int) -> int:
    """The body length a request announces, refused (400/413) when it is malformed or over ``limit``."""
    raw = headers.get("Content-Length", "0")
    try:
        n = int(raw)
    except ValueError:
        raise HttpError(400, "bad Content-Length") from None
    if n < 0:
        raise HttpError(400, "bad Content-Length")
    if n > limit:
        raise HttpError(413, f"body must be at most {limit} bytes, got {n}")
    return n


def _handler(app: App, limits: Limits) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = limits.timeout_s  # StreamRequestHandler sets it on the socket: every read and write

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.code)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(reply.body)

        def _serve(self, method: str) -> None:
            # a socket error (timeout, reset) while reading the body propagates: http.server drops
            # the connection; only the application's own failures become a JSON reply
            try:
                n = content_length(self.headers, limits.max_body) if method == "POST" else 0
            except HttpError as exc:
                self._send(Reply.json(exc.code, {"error": str(exc)}))
                return
            body = self.rfile.read(n) if n else b""
            try:
                reply = app(Request(method, self.path, self.headers, body))
            except HttpError as exc:
                reply = Reply.json(exc.code, {"error": str(exc)})
            except Exception as exc:  # noqa: BLE001 - answer with JSON, never a stack trace page
                reply = Reply.json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
            self._send(reply)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

    return Handler


_BUSY_BODY = b'{"error": "too many connections, try again"}'
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], cap: int) -> None:
        self.request_queue_size = max(5, cap)
        self._slots = threading.BoundedSemaphore(cap)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:  # a few bytes into a fresh socket's buffer: does not block the accept loop
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class HttpServer:
    """``app`` served on ``addr:port`` (loopback and any free port by default) from a daemon thread.

    A port that cannot be bound is a :class:`ConfigError` naming ``addr:port`` and ``hint``.
    """

    def __init__(
        self,
        app: App,
        *,
        addr: str = LOOPBACK,
        port: int = 0,
        limits: Limits | None = None,
        name: str = "stalwart-http",
        purpose: str = "listen on",
        hint: str = "choose a free --port",
    ) -> None:
        self.limits = limits or Limits()
        self.name = name
        try:
            self.httpd = _Server((addr, port), _handler(app, self.limits), self.limits.max_connections)
        except OSError as exc:
            raise ConfigError(f"cannot {purpose} {addr}:{port}: {exc.strerror}", hint) from exc
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return (host.decode() if isinstance(host, bytes) else str(host)), int(port)

    def url(self, path: str = "/") -> str:
        host, port = self.address
        return f"http://{host}:{port}{path}"

    def start(self) -> HttpServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, name=self.name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and close the socket (safe when never started; bounded wait)."""
        if self._thread is not None:
            self.httpd.shutdown()  # blocks until serve_forever returns: only call it when it runs
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(5.0)


def serve_until_signal(stop: Callable[[], None], ready: Callable[[], None] | None = None) -> NoReturn:
    """Block until SIGTERM or SIGINT, then call ``stop`` and end the process with status 0.

    SIGINT is handled explicitly, not left to KeyboardInterrupt: a server started in the background by
    a script inherits SIGINT ignored, Python then raises no KeyboardInterrupt, and ``kill -INT`` must
    still stop it. ``ready`` (which prints the server's address) runs once the handlers are in place,
    so a script that waits for that line and then signals is never ignored. ``os._exit`` after
    ``stop``: a daemon thread still answering a request must not hold the process open.
    """
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        if ready is not None:
            ready()
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop()
    os._exit(0)
