"""The peer store: a node's agent keeps copies of another node's memory-tier files, so that a
replacement node restores from a healthy peer instead of shared storage.

Served over HTTP by a thread the agent starts (``PeerStore.start``) and stops when the job ends; it
outlives worker restarts. Rules:

* bound to the address given (the node's rendezvous address; loopback for tests), never 0.0.0.0;
* every request carries ``X-Stalwart-Auth``: HMAC-SHA256 with the per-run secret over the method,
  the path, the body's SHA-256, the client's clock (``X-Stalwart-Time``) and a random nonce
  (``X-Stalwart-Nonce``), so the secret never travels and a recorded request cannot be replayed: the
  store refuses a time more than ``WINDOW_S`` from its own clock and a nonce it saw within that
  window; every reply is signed over the same nonce, so a client can tell the peer's reply to this
  request from one forged or replayed on the wire;
* names are never paths: the owner node, the step and the file name are checked against strict
  patterns before any file is touched, and files are only ever opened below the store's own roots;
* sizes bounded: a file larger than ``max_file_bytes``, or one that would take the store over
  ``max_total_bytes``, is refused (413) before its body is read;
* served by :mod:`stalwart.http_server`: the request headers within ``timeout_s`` of connecting,
  its connection caps (per source address; and a request counts against the cap that signed
  requests share only once its signature is checked), and a whole request within
  ``timeout_s + size / MIN_RATE``.

Layout below ``held`` (the copies of other nodes' files): ``<owner>/.step-<N>.partial/<file>``
while a step arrives, renamed to ``<owner>/step-<N>/`` when its manifest (sent last) arrives; the
owner's older steps are then deleted (one version per owner). ``own`` is this node's memory tier
(``step-<N>/`` directories committed by the workers), served read-only.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.client
import os
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from ..http_server import HttpServer, Limits
from .manifest import MANIFEST, Manifest
from .store import step_name
from .tiers import private_dir

AUTH = "X-Stalwart-Auth"
DIGEST = "X-Sha256"
STAMP = "X-Stalwart-Time"
NONCE = "X-Stalwart-Nonce"
WINDOW_S = 300.0  # how far a request's clock may be from the store's (nodes' clocks are NTP-synced)
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_FILE_BYTES = 64 << 30
DEFAULT_MAX_TOTAL_BYTES = 256 << 30
MIN_RATE = 10 << 20  # bytes/s a request must at least move (its deadline: timeout + size / rate)
_CHUNK = 1 << 20
_OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_FILE = re.compile(r"^(?:\.metadata|MANIFEST\.json|rank-\d{1,7}\.pt|__\d{1,7}_\d{1,7}\.distcp)$")
_STEP = re.compile(r"^\d{1,9}$")
_ANY_STEP = re.compile(r"^\.?step-(\d{9})(?:\.partial)?$")
_NONCE = re.compile(r"^[0-9a-f]{32}$")


class PeerError(Exception):
    """A peer could not be reached or refused the request; the message says which and why."""


def sign(secret: bytes, *parts: str) -> str:
    return hmac.new(secret, "\n".join(parts).encode(), hashlib.sha256).hexdigest()


class Nonces:
    """The nonces seen within the replay window: a request is fresh when its time is within
    ``WINDOW_S`` of ``now`` and its nonce was not seen (then it is remembered until it expires)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def fresh(self, stamp: str, nonce: str, now: float) -> bool:
        try:
            t = float(stamp)
        except ValueError:
            return False
        if not _NONCE.match(nonce) or abs(now - t) > self.window_s:
            return False
        with self._lock:
            if len(self._seen) > 4096:
                self._seen = {n: e for n, e in self._seen.items() if e > now}
            if self._seen.get(nonce, 0.0) > now:
                return False
            self._seen[nonce] = now + 2 * self.window_s
        return True


def request_headers(
    secret: bytes, method: str, path: str, digest: str = "", *, now: float | None = None
) -> dict[str, str]:
    """The authentication headers of one request: a fresh nonce and ``now`` (default: the clock)."""
    stamp, nonce = f"{time.time() if now is None else now:.3f}", secrets.token_hex(16)
    return {STAMP: stamp, NONCE: nonce, AUTH: sign(secret, method, path, digest, stamp, nonce)}


def valid_owner(owner: str) -> bool:
    return bool(_OWNER.match(owner))


def valid_file(name: str) -> bool:
    """The only file names a checkpoint version holds (DCP shards, metadata, rank extras, manifest)."""
    return bool(_FILE.match(name))


@dataclass(frozen=True)
class Peer:
    node: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.node} ({self.host}:{self.port})"


def parse_peers(text: str) -> tuple[Peer, ...]:
    """``node=host:port,...`` (as the agent writes it for its workers), in group-rank order."""
    out = []
    for item in filter(None, text.split(",")):
        node, _, addr = item.partition("=")
        host, _, port = addr.rpartition(":")
        if not (valid_owner(node) and host and port.isdigit()):
            raise ValueError(f"peer entry {item[:80]!r} is not node=host:port")
        out.append(Peer(node, host.strip("[]"), int(port)))
    return tuple(out)


def format_peers(peers: tuple[Peer, ...] | list[Peer]) -> str:
    return ",".join(f"{p.node}={p.host}:{p.port}" for p in peers)


class PeerStore:
    """The serving side (one per agent), on the project's one HTTP server (:mod:`stalwart.http_server`:
    its header timeout, connection cap and body limit; a request's deadline grows with its size)."""

    def __init__(
        self,
        *,
        node: str,
        held: Path,
        own: Path,
        host: str,
        secret: bytes,
        port: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> None:
        if host in ("", "0.0.0.0", "::"):
            raise ValueError("the peer store binds to one intended address, not every interface")
        self.node = node
        self.held = private_dir(Path(held))
        self.own = Path(own)
        self.timeout_s = timeout_s
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self._secret = secret
        self.nonces = Nonces()
        self._lock = threading.Lock()
        self._reserved = 0  # bytes of bodies being received
        limits = Limits(
            header_timeout_s=timeout_s, handler_s=timeout_s, max_body=max_file_bytes, min_rate=MIN_RATE
        )
        self._server = HttpServer(
            stream=self._serve,
            authenticate=self._authenticate,
            addr=host,
            port=port,
            limits=limits,
            name="stalwart-peer",
            hint="",
        )
        self.host, self.port = self._server.address

    def start(self) -> PeerStore:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def secret(self) -> bytes:
        return self._secret

    # --- storage --------------------------------------------------------------------------

    def held_bytes(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.held):
            for f in files:
                try:
                    total += os.lstat(os.path.join(dirpath, f)).st_size
                except OSError:
                    pass
        return total

    def reserve(self, size: int) -> str:
        """Claim room for a body of ``size`` bytes; "" or why not."""
        if size > self.max_file_bytes:
            return f"{size} bytes is more than the {self.max_file_bytes} a file may have"
        with self._lock:
            if self.held_bytes() + self._reserved + size > self.max_total_bytes:
                return f"storing {size} more bytes would exceed the store's {self.max_total_bytes}"
            self._reserved += size
        return ""

    def release(self, size: int) -> None:
        with self._lock:
            self._reserved -= size

    def incoming(self, owner: str, step: int) -> Path:
        return self.held / owner / f".{step_name(step)}.partial"

    def commit(self, owner: str, step: int) -> None:
        """The owner's manifest arrived: make the step visible and drop the owner's other versions."""
        with self._lock:
            base = self.held / owner
            final = base / step_name(step)
            if final.exists():
                shutil.rmtree(final)
            os.replace(self.incoming(owner, step), final)
            for p in base.iterdir():  # older versions, complete or not, of this owner
                m = _ANY_STEP.match(p.name)
                if m and int(m.group(1)) < step:
                    shutil.rmtree(p, ignore_errors=True)

    def find(self, step: int, name: str) -> Path | None:
        """A committed copy of file ``name`` of ``step``: this node's own memory tier first."""
        own = self.own / step_name(step) / name
        if own.is_file() and not own.is_symlink():
            return own
        if self.held.is_dir():
            for owner in sorted(self.held.iterdir()):
                f = owner / step_name(step) / name
                if valid_owner(owner.name) and f.is_file() and not f.is_symlink():
                    return f
        return None

    # --- requests -------------------------------------------------------------------------

    def _signed(self, request: web.BaseRequest, code: int, body: bytes = b"") -> web.Response:
        """A reply signed over the request's target and nonce (the client checks both)."""
        digest = hashlib.sha256(body).hexdigest()
        target, nonce = request.rel_url.raw_path_qs, request.headers.get(NONCE, "")
        auth = sign(self.secret, "reply", str(code), target, digest, nonce)
        return web.Response(status=code, body=body, headers={DIGEST: digest, AUTH: auth})

    def _authenticate(self, request: web.BaseRequest) -> web.Response | None:
        """The server's hook, run once the headers are in and before the request counts against the
        connection cap: None for a request signed with the run's secret (its nonce is then used up),
        else a signed 403. ``_serve`` is only ever called for a request this accepted."""
        digest = ""
        if request.method == "PUT":
            digest = request.headers.get(DIGEST, "")
            if not re.match(r"^[0-9a-f]{64}$", digest):
                return self._signed(request, 403, b"not authorized")
        if not self._authorized(request, request.rel_url.raw_path_qs, digest):
            return self._signed(request, 403, b"not authorized")
        return None

    async def _serve(self, request: web.BaseRequest, size: int) -> web.StreamResponse:
        target = request.rel_url.raw_path_qs

        def reply(code: int, body: bytes = b"") -> web.Response:
            return self._signed(request, code, body)

        if request.method == "GET":
            return await self._get(request, target, reply)
        if request.method == "PUT":
            return await self._put(request, target, size, reply)
        return reply(405, b"GET or PUT")

    def _authorized(self, request: web.BaseRequest, target: str, digest: str) -> bool:
        h = request.headers
        given, stamp, nonce = h.get(AUTH, ""), h.get(STAMP, ""), h.get(NONCE, "")
        want = sign(self.secret, request.method, target, digest, stamp, nonce)
        # the signature first: an unsigned request must not fill the nonce table
        return hmac.compare_digest(given.encode(), want.encode()) and self.nonces.fresh(
            stamp, nonce, time.time()
        )

    async def _get(self, request: web.BaseRequest, target: str, reply) -> web.Response:
        parts = _parts(target, 3)
        if parts is None or parts[0] != "f" or not _STEP.match(parts[1]) or not valid_file(parts[2]):
            return reply(404, b"no such file")
        found = self.find(int(parts[1]), parts[2])
        if found is None:
            return reply(404, b"no such file")
        try:  # memory-tier files: already in RAM (tmpfs); read off the event loop all the same
            data = await asyncio.get_running_loop().run_in_executor(None, found.read_bytes)
        except OSError:
            return reply(404, b"no such file")
        return reply(200, data)

    async def _put(self, request: web.BaseRequest, target: str, size: int, reply) -> web.Response:
        digest = request.headers.get(DIGEST, "")  # checked, with the signature, by _authenticate
        parts = _parts(target, 4)
        if (
            parts is None
            or parts[0] != "h"
            or not valid_owner(parts[1])
            or parts[1] == self.node
            or not _STEP.match(parts[2])
            or not valid_file(parts[3])
        ):
            return reply(400, b"bad owner, step or file name")
        if "Content-Length" not in request.headers:
            return reply(411, b"a Content-Length is required")
        if why := self.reserve(size):
            return reply(413, why.encode())
        try:
            return await self._receive(request, parts[1], int(parts[2]), parts[3], size, digest, reply)
        finally:
            self.release(size)

    async def _receive(self, request, owner: str, step: int, name: str, size: int, digest: str, reply):
        work = self.incoming(owner, step)
        private_dir(work)
        tmp = work / f".{name}.tmp"
        h = hashlib.sha256()
        left = size
        try:  # the server's deadline (timeout + size / MIN_RATE) cancels a body that crawls
            with open(tmp, "wb") as fh:
                while left:
                    chunk = await request.content.read(min(_CHUNK, left))
                    if not chunk:
                        raise ConnectionError("body ended early")
                    h.update(chunk)
                    fh.write(chunk)
                    left -= len(chunk)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if h.hexdigest() != digest:
            tmp.unlink(missing_ok=True)
            return reply(400, b"body does not match its digest")
        if name == MANIFEST:
            try:
                manifest = Manifest.from_json(tmp.read_bytes())
            except ValueError as exc:
                tmp.unlink(missing_ok=True)
                return reply(400, str(exc).encode()[:500])
            if manifest.step != step:
                tmp.unlink(missing_ok=True)
                return reply(400, b"manifest is for another step")
        os.replace(tmp, work / name)
        if name == MANIFEST:
            self.commit(owner, step)
        return reply(201)


def _parts(target: str, n: int) -> list[str] | None:
    parts = target.split("/")
    if len(parts) != n + 2 or parts[0] != "" or parts[1] != "v1":
        return None
    return parts[2:]


class PeerClient:
    """The workers' side: send this node's files to a peer, fetch files from peers."""

    def __init__(self, secret: bytes, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.secret = secret
        self.timeout_s = timeout_s

    def _request(self, peer: Peer, method: str, path: str, body=None, size: int = 0, digest: str = ""):
        conn = http.client.HTTPConnection(peer.host, peer.port, timeout=self.timeout_s)
        headers = request_headers(self.secret, method, path, digest) | {"Content-Length": str(size)}
        if digest:
            headers[DIGEST] = digest
        try:
            conn.request(method, path, body=body, headers=headers)
            return conn, conn.getresponse(), headers[NONCE]
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise PeerError(f"peer {peer}: {type(exc).__name__}: {exc}") from None

    def put(self, peer: Peer, owner: str, step: int, name: str, path: Path, digest: str) -> None:
        size = path.stat().st_size
        url = f"/v1/h/{owner}/{step}/{name}"
        with open(path, "rb") as fh:
            conn, resp, nonce = self._request(peer, "PUT", url, fh, size, digest)
        try:
            body = self._read(peer, resp, url, 1 << 16, nonce)
        finally:
            conn.close()
        if resp.status != 201:
            raise PeerError(
                f"peer {peer} refused {name}: {resp.status} {body.decode(errors='replace')[:200]}"
            )

    def get(self, peer: Peer, step: int, name: str, max_bytes: int) -> bytes:
        """File ``name`` of ``step`` as ``peer`` holds it (the reply's signature checked)."""
        url = f"/v1/f/{step}/{name}"
        conn, resp, nonce = self._request(peer, "GET", url)
        try:
            body = self._read(peer, resp, url, max_bytes, nonce)
        finally:
            conn.close()
        if resp.status != 200:
            raise PeerError(f"peer {peer} has no {name} of step {step} ({resp.status})")
        return body

    def _read(
        self, peer: Peer, resp: http.client.HTTPResponse, url: str, max_bytes: int, nonce: str
    ) -> bytes:
        try:
            size = int(resp.getheader("Content-Length") or -1)
        except ValueError:
            size = -1
        if size < 0 or size > max_bytes:
            raise PeerError(f"peer {peer} replied with {size} bytes (at most {max_bytes} expected)")
        deadline = time.monotonic() + self.timeout_s + size / MIN_RATE
        chunks, left = [], size
        try:
            while left:
                if time.monotonic() > deadline:
                    raise PeerError(f"peer {peer}: reply not received within its deadline")
                chunk = resp.read(min(_CHUNK, left))
                if not chunk:
                    raise PeerError(f"peer {peer}: reply ended early")
                chunks.append(chunk)
                left -= len(chunk)
        except (OSError, http.client.HTTPException) as exc:
            raise PeerError(f"peer {peer}: {type(exc).__name__}: {exc}") from None
        body = b"".join(chunks)
        digest = hashlib.sha256(body).hexdigest()
        want = sign(self.secret, "reply", str(resp.status), url, digest, nonce)
        if resp.getheader(DIGEST) != digest or not hmac.compare_digest(
            (resp.getheader(AUTH) or "").encode(), want.encode()
        ):
            # the server's own refusals (413 over its body limit, 503 past a deadline) are unsigned
            raise PeerError(f"peer {peer}: reply ({resp.status}) not signed with this run's secret")
        return body
