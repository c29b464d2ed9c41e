"""The one HTTP server under the dashboard, the notification receiver, the metrics endpoint and the
peer store (on the ground floor, so that checkpoint/ can serve with it too): aiohttp's low-level server on its own event-loop thread, with every limit decided here.

:class:`Limits`, one place for what a client may cost:

* ``header_timeout_s``: from accept to the end of the request headers. aiohttp has no such timeout
  (its parser waits for as long as bytes trickle in), so each connection is wrapped in a small
  protocol (:class:`_Guard`) that aborts it when the headers are not complete in time: a slowloris
  client sending one byte every few seconds is dropped, and holds no thread meanwhile;
* ``handler_s``: reading the body and answering, per request (plus ``size / min_rate`` for a large
  body, as the peer store's shards); past it the client gets a 503 and the connection is closed;
* ``max_pending``: connections whose request is not yet admitted (headers still arriving, or not
  yet authenticated); one more is answered 503 at once and closed;
* ``max_per_source``: of those, from one source address (an IPv6 address counts by its /64); one
  more from that source is answered 503 at once, without touching the other counts, so one client
  holding idle connections cannot crowd out the others. A server with an ``authenticate`` hook stops
  counting a connection against its source once its request is authenticated;
* ``max_connections``: admitted requests at once (being read and answered). A request is admitted
  when its headers are complete and, where the server has an ``authenticate`` hook (the peer store's
  HMAC), once the hook accepts it: idle or unauthenticated clients fill only the pending pool, never
  this one. One more is answered 503;
* ``max_body``: a larger ``Content-Length`` is answered 413 before a byte of the body is read.

One request per connection (every reply says ``Connection: close``): the header timeout then covers
every request. An application is either a function from a :class:`Request` to a :class:`Reply`, run
on a thread pool of ``max_connections`` threads, or (``stream=``) a coroutine given aiohttp's request
and the checked body length, for bodies that must be streamed. It raises :class:`HttpError` for a
4xx; any other exception becomes a 500 with a one-line JSON ``error``, never a stack trace page.
Every reply carries ``Cache-Control: no-store`` and ``nosniff``.

:func:`serve_until_signal` is the foreground loop of the ``serve`` commands; :func:`warn_if_exposed`
their loud warning for an address beyond loopback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import urlsplit

from aiohttp import web
from multidict import CIMultiDict

from .errors import ConfigError

LOOPBACK = "127.0.0.1"  # the address every server binds unless told otherwise

JSON = "application/json"

MAX_CONNECTIONS = 32  # admitted requests at once
MAX_PENDING = 128  # connections not yet admitted (headers arriving, not yet authenticated)
MAX_PER_SOURCE = 8  # of those, from one source address (an IPv6 /64)


@dataclass(frozen=True)
class Limits:
    """What one server allows a client (see the module's docstring)."""

    header_timeout_s: float = 10.0
    handler_s: float = 15.0
    max_connections: int = MAX_CONNECTIONS
    max_body: int = 64 * 1024
    min_rate: float = 0.0  # bytes/s; > 0: a body of n bytes gets handler_s + n / min_rate
    max_pending: int = MAX_PENDING
    max_per_source: int = MAX_PER_SOURCE

    def __post_init__(self) -> None:
        if (
            self.header_timeout_s <= 0
            or self.handler_s <= 0
            or self.max_connections < 1
            or self.max_pending < 1
            or self.max_per_source < 1
            or self.max_body < 0
            or self.min_rate < 0
        ):
            raise ValueError(f"invalid HTTP limits: {self}")

    def deadline_s(self, body: int) -> float:
        return self.handler_s + (body / self.min_rate if self.min_rate else 0.0)


@dataclass(frozen=True)
class Request:
    method: str  # GET | POST | ...
    target: str  # the request target as sent: path and query
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def path(self) -> str:
        return urlsplit(self.target).path


@dataclass(frozen=True)
class Reply:
    code: int
    body: bytes
    content_type: str = JSON
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, code: int, obj: Any) -> Reply:  # Any: json.dumps takes any object (default=str)
        return cls(code, json.dumps(obj, default=str).encode())


class HttpError(Exception):
    """A refusal with its status code; the client gets ``{"error": message}``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


App = Callable[[Request], Reply]
StreamApp = Callable[[web.BaseRequest, int], Awaitable[web.StreamResponse]]
# a stream server's check of a request's headers: None when authenticated, else the refusal to send
Authenticate = Callable[[web.BaseRequest], web.StreamResponse | None]


def content_length(headers: Mapping[str, str], limit: int) -> int:
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


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_exposed(what: str, addr: str) -> None:
    """A loud warning on stderr when ``addr`` is beyond loopback (every interface above all)."""
    if is_loopback(addr):
        return
    where = "EVERY interface" if addr in ("0.0.0.0", "::", "") else f"{addr}, beyond loopback"
    print(
        f"WARNING: {what} listens on {where}: anyone who can reach this port can try it. It is "
        "protected only by its token; put it behind a firewall or a TLS proxy, or bind 127.0.0.1",
        file=sys.stderr,
        flush=True,
    )


_BUSY_BODY = b'{"error": "too many connections, try again"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


def source_of(peername: Any) -> str:  # Any: asyncio's get_extra_info('peername') is untyped (a tuple or None)
    """The address a connection counts against: its IP, an IPv6 address by its /64 (one host's)."""
    host = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class _Guard(asyncio.Protocol):
    """One connection: pending (counted against the pending pool and its source) until its request
    is admitted, then active; aborted when its headers are late; else aiohttp's."""

    def __init__(self, owner: HttpServer, inner: asyncio.Protocol) -> None:
        self.owner, self.inner = owner, inner
        self.transport: asyncio.Transport | None = None
        self.counted = False
        self.source = ""
        self.pending = self.active = self.per_source = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        owner, limits = self.owner, self.owner.limits
        self.source = source_of(transport.get_extra_info("peername"))
        if (
            owner.pending_connections >= limits.max_pending
            or owner.per_source.get(self.source, 0) >= limits.max_per_source
        ):
            transport.write(_BUSY)
            transport.close()
            return
        owner.pending_connections += 1
        owner.per_source[self.source] = owner.per_source.get(self.source, 0) + 1
        self.counted = self.pending = self.per_source = True
        owner.guards[transport] = self
        self.timer = asyncio.get_running_loop().call_later(limits.header_timeout_s, transport.abort)
        self.inner.connection_made(transport)

    def headers_done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def admit(self, authenticated: bool) -> bool:
        """Move this connection's request from the pending pool to the active one (False: full);
        an authenticated one stops counting against its source."""
        owner = self.owner
        if self.active:
            return True
        if owner.active_connections >= owner.limits.max_connections:
            return False
        self._leave_pending()
        owner.active_connections += 1
        self.active = True
        if authenticated:
            self._leave_source()
        return True

    def _leave_pending(self) -> None:
        if self.pending:
            self.pending = False
            self.owner.pending_connections -= 1

    def _leave_source(self) -> None:
        if self.per_source:
            self.per_source = False
            left = self.owner.per_source.get(self.source, 1) - 1
            if left > 0:
                self.owner.per_source[self.source] = left
            else:
                self.owner.per_source.pop(self.source, None)

    def data_received(self, data: bytes) -> None:
        if self.counted:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.counted else None

    def pause_writing(self) -> None:
        if self.counted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.counted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.headers_done()
        if self.counted:
            self.counted = False
            self._leave_pending()
            self._leave_source()
            if self.active:
                self.active = False
                self.owner.active_connections -= 1
            self.owner.guards.pop(self.transport, None)  # type: ignore[arg-type]
            self.inner.connection_lost(exc)


def _error(code: int, message: str) -> Reply:
    return Reply.json(code, {"error": message})


class HttpServer:
    """``app`` (or ``stream``) served on ``addr:port`` (loopback and any free port by default) from
    an event-loop thread. A port that cannot be bound is a :class:`ConfigError` naming ``addr:port``
    and ``hint``."""

    def __init__(
        self,
        app: App | None = None,
        *,
        stream: StreamApp | None = None,
        authenticate: Authenticate | None = None,
        addr: str = LOOPBACK,
        port: int = 0,
        limits: Limits | None = None,
        name: str = "stalwart-http",
        purpose: str = "listen on",
        hint: str = "choose a free --port",
    ) -> None:
        if (app is None) == (stream is None):
            raise ValueError("give an app or a stream app")
        self.app, self.stream, self.authenticate = app, stream, authenticate
        self.limits = limits or Limits()
        self.name = name
        # the counts below are touched only on the loop's thread
        self.pending_connections = 0  # not yet admitted
        self.active_connections = 0  # admitted
        self.per_source: dict[str, int] = {}  # connections counted against each source
        self.guards: dict[asyncio.Transport, _Guard] = {}
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        try:
            self.sock = socket.create_server(
                (addr.strip("[]"), port), family=family, backlog=max(8, self.limits.max_pending)
            )
        except OSError as exc:
            raise ConfigError(f"cannot {purpose} {addr}:{port}: {exc.strerror}", hint) from exc
        self.sock.setblocking(False)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.limits.max_connections, name)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._web: web.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def url(self, path: str = "/") -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"

    def start(self) -> HttpServer:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._open())
            except BaseException as exc:  # noqa: BLE001 - reported to start()'s caller
                failed.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        ready.wait(30.0)
        if failed:
            raise failed[0]
        return self

    async def _open(self) -> None:
        self._web = web.Server(self._handle, access_log=None, max_line_size=8190, max_field_size=8190)
        web_server = self._web
        self._server = await self._loop.create_server(lambda: _Guard(self, web_server()), sock=self.sock)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._web is not None:
            await self._web.shutdown(1.0)
        # what shutdown left (a handler still discarding a refused request's body): cancelled, so that
        # no task is left pending when the loop stops
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=1.0)

    def stop(self) -> None:
        """Stop accepting and close the socket (safe when never started; bounded waits)."""
        if self._thread is not None and self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(5.0)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        self.sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- one request ---------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        guard = self.guards.get(request.transport)  # type: ignore[arg-type]
        if guard is not None:
            guard.headers_done()
        if self.authenticate is not None:
            refusal = self.authenticate(request)
            if refusal is not None:
                refusal.force_close()
                return refusal
        if guard is not None and not guard.admit(self.authenticate is not None):
            return self._send(_error(503, "too many connections, try again"))
        try:
            size = content_length(request.headers, self.limits.max_body)
        except HttpError as exc:
            return self._send(_error(exc.code, str(exc)))
        try:
            got = await asyncio.wait_for(self._respond(request, size), self.limits.deadline_s(size))
        except asyncio.TimeoutError:
            got = _error(503, f"request not handled within {self.limits.deadline_s(size):.0f} s")
        except (asyncio.IncompleteReadError, ConnectionError):
            got = _error(400, "body ended early")
        if isinstance(got, Reply):
            return self._send(got)
        got.force_close()
        return got

    async def _respond(self, request: web.BaseRequest, size: int) -> Reply | web.StreamResponse:
        if self.stream is not None:
            return await self.stream(request, size)
        body = await request.content.readexactly(size) if size else b""
        req = Request(request.method, request.rel_url.raw_path_qs, request.headers, body)
        return await self._loop.run_in_executor(self._pool, self._call, req)

    def _call(self, req: Request) -> Reply:
        assert self.app is not None
        try:
            return self.app(req)
        except HttpError as exc:
            return _error(exc.code, str(exc))
        except Exception as exc:  # noqa: BLE001 - answer with JSON, never a stack trace page
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    @staticmethod
    def _send(reply: Reply) -> web.Response:
        headers = CIMultiDict(reply.headers)
        headers["Content-Type"] = reply.content_type
        headers["Cache-Control"] = "no-store"
        headers["X-Content-Type-Options"] = "nosniff"
        resp = web.Response(status=reply.code, body=reply.body, headers=headers)
        resp.force_close()
        return resp


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
