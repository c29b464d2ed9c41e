"""The rendezvous on etcd (``--rdzv-backend etcd``): no single host whose loss ends the job.

torch's dynamic rendezvous keeps its state in a :class:`RendezvousBackend`; with c10d that state and
the round's store live in one agent's TCPStore, so losing that host ends the job. Here both live in an
etcd cluster (Debian's ``etcd-server``, 3.4): with three members any one host may go, the one that
held the previous round's worker store included (each round's group rank 0 hosts a fresh one,
launch/rendezvous/node_rendezvous.py), and the survivors re-form like after any other membership change.

etcd is spoken through its v3 JSON gateway (``/v3/kv/...``) over ``urllib``, every request with a
deadline, trying the members in turn. The state is compare-and-swapped on the key's mod revision.
``--rdzv-endpoint`` lists the members, ``HOST:PORT[,HOST:PORT...]``; torch's name ``etcd-v2`` is
accepted for the same backend (torch's own etcd-v2 needs the v2 API, which etcd 3.4 turns off).

Members run with TLS and client certificates, or with users, are reached with ``--etcd-cacert``,
``--etcd-cert``/``--etcd-key`` and ``--etcd-user``/``--etcd-password-file`` (settings/etcd_access.py):
https with the members' certificates verified, and a token from ``/v3/auth/authenticate`` in the
``Authorization`` header of every call, fetched again once when etcd rejects it. A member that refuses
this client (its certificate, its user) raises :class:`EtcdAccessError`, one sentence that says what
to fix, never a retry.
"""

from __future__ import annotations

import base64
import datetime
import json
import time
import urllib.error
import urllib.request
from typing import Any

from torch.distributed import Store
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousTimeout,
    Token,
)

from ...errors import ConfigError
from ...settings.etcd_access import TOKEN_REJECTED, EtcdAccess, auth_refusal, gateway_error, refusal

REQUEST_S = 3.0  # one request's deadline; the next member is tried after it


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def members(endpoint: str, https: bool = False) -> list[str]:
    """``http://host:port`` (``https://`` with TLS) of each member of ``HOST:PORT[,HOST:PORT...]``."""
    scheme = "https" if https else "http"
    out = []
    for part in (p.strip() for p in endpoint.split(",") if p.strip()):
        out.append(part if part.startswith(("http://", "https://")) else f"{scheme}://{part}")
    return out


def _plain_hint(member: str, exc: BaseException) -> str:
    """A member that serves https drops a plain http connection without a word: say so. It closes it
    (``RemoteDisconnected``) or, when the reply races the close, resets it; ``urlopen`` wraps a reset
    met while sending in a ``URLError``."""
    cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if member.startswith("http://") and isinstance(cause, ConnectionResetError):  # RemoteDisconnected is one
        return " (a member that serves https closes plain connections: give --etcd-cacert)"
    return ""


class EtcdAccessError(ConfigError, RendezvousConnectionError):
    """etcd refused this client (its certificate, its CA, its user or its permissions): asking again
    does not help until the ``--etcd-*`` options or etcd's users change."""


class _TokenRejected(Exception):
    """etcd no longer takes the client's token (expired, or its auth store changed)."""


class EtcdClient:
    """The few calls of etcd's v3 JSON gateway the rendezvous needs, each with a deadline."""

    def __init__(self, endpoint: str, request_s: float = REQUEST_S, access: EtcdAccess | None = None) -> None:
        self.access = access or EtcdAccess()
        self.members = members(endpoint, https=self.access.tls)
        if not self.members:
            raise ValueError("the etcd rendezvous needs --rdzv-endpoint HOST:PORT[,HOST:PORT...]")
        self.access.check("etcd", endpoint)
        https = any(m.startswith("https://") for m in self.members)
        self._context = self.access.ssl_context() if https else None
        self._password = self.access.password() if self.access.user else ""
        self._token: str | None = None if self.access.user else ""  # "": no token sent
        self.request_s = request_s
        self._first = 0  # the member that answered last: asked first next time

    # Any: a request and reply of etcd's JSON gateway, JSON of any shape
    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._token is None:
            self._authenticate()
        try:
            return self._ask(path, body)
        except _TokenRejected:
            self._authenticate()  # once: etcd dropped the token (expired, or its users changed)
        try:
            return self._ask(path, body)
        except _TokenRejected as exc:
            raise EtcdAccessError(f"etcd rejected user {self.access.user!r}'s new token: {exc}") from None

    def _authenticate(self) -> None:
        body = {"name": self.access.user, "password": self._password}
        self._token = ""  # the authenticate call itself carries none
        self._token = str(self._ask("auth/authenticate", body).get("token") or "")

    # Any: a request and reply of etcd's JSON gateway, JSON of any shape
    def _ask(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One call, to each member in turn until one answers."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = self._token
        errors: list[str] = []
        refused: list[str] = []
        n = len(self.members)
        for i in range(n):
            k = (self._first + i) % n
            member = self.members[k]
            req = urllib.request.Request(f"{member}/v3/{path}", data=data, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.request_s, context=self._context) as resp:
                    out = json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as exc:
                message = self._answered(path, exc)
                if message is None:
                    return {}  # authenticate, and etcd has no users: it takes every client
                errors.append(f"{member}: HTTP {exc.code} {message}")
                continue
            except (OSError, ValueError) as exc:
                why = refusal(exc, member, self.access)
                (refused if why else errors).append(why or f"{member}: {exc}{_plain_hint(member, exc)}")
                continue
            self._first = k
            return out
        if refused:
            raise EtcdAccessError("; ".join(refused + errors))
        raise RendezvousConnectionError("no etcd member answered: " + "; ".join(errors))

    def _answered(self, path: str, exc: urllib.error.HTTPError) -> str | None:
        """The gateway's error message; raised when it is about this client's identity (None: the
        authentication that etcd does not need)."""
        try:
            message = gateway_error(exc.read()) or str(exc.reason)
        except OSError:
            message = str(exc.reason)
        if path == "auth/authenticate" and "authentication is not enabled" in message:
            return None
        if any(t in message for t in TOKEN_REJECTED) or (
            self.access.user and "user name is empty" in message
        ):
            raise _TokenRejected(message)
        why = auth_refusal(message, self.access)
        if why:
            raise EtcdAccessError(why)
        return message

    def get(self, key: str) -> tuple[bytes, int] | None:
        """The key's value and mod revision (a linearizable read: it needs a quorum)."""
        kvs = self.call("kv/range", {"key": _b64(key)}).get("kvs") or []
        if not kvs:
            return None
        return _unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"])

    def put(self, key: str, value: bytes) -> None:
        self.call("kv/put", {"key": _b64(key), "value": _b64(value)})

    def swap(self, key: str, value: bytes, mod_revision: int) -> tuple[bool, tuple[bytes, int] | None]:
        """Put ``value`` if the key's mod revision is ``mod_revision`` (0: the key does not exist);
        whether it did, and the key's value and revision after the attempt."""
        r = self.call(
            "kv/txn",
            {
                "compare": [
                    {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}
                ],
                "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}],
                "failure": [{"request_range": {"key": _b64(key)}}],
            },
        )
        if r.get("succeeded"):
            rev = int(r.get("header", {}).get("revision", 0))
            return True, (value, rev)
        for resp in r.get("responses") or []:
            kvs = (resp.get("response_range") or {}).get("kvs") or []
            if kvs:
                return False, (_unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"]))
        return False, None

    def probe(self) -> None:
        self.get("/stalwart/probe")


class EtcdRendezvousBackend(RendezvousBackend):
    """torch's rendezvous state in one etcd key, compare-and-swapped on its mod revision."""

    def __init__(self, client: EtcdClient, run_id: str) -> None:
        self.client = client
        self.key = f"/stalwart/rdzv/{run_id}/state"

    @property
    def name(self) -> str:
        return "etcd"

    def get_state(self) -> tuple[bytes, Token] | None:
        return self.client.get(self.key)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        expected = token if isinstance(token, int) else 0
        ok, now = self.client.swap(self.key, state, expected)
        if now is None:
            return None
        return now[0], now[1], ok


class EtcdStore(Store):
    """The round's key-value store on etcd (what c10d keeps in the host's TCPStore): ``get`` and
    ``wait`` poll until the key exists, within the store's timeout."""

    def __init__(self, client: EtcdClient, prefix: str, timeout_s: float, poll_s: float = 0.1) -> None:
        super().__init__()
        self.client, self.prefix, self.poll_s = client, prefix.rstrip("/"), poll_s
        self.timeout_s = timeout_s

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def set(self, key: str, value: str | bytes) -> None:
        self.client.put(self._key(key), value.encode() if isinstance(value, str) else bytes(value))

    def get(self, key: str) -> bytes:
        self.wait([key])
        got = self.client.get(self._key(key))
        if got is None:
            raise LookupError(f"etcd store: {key} vanished")
        return got[0]

    def check(self, keys: list[str]) -> bool:
        return all(self.client.get(self._key(k)) is not None for k in keys)

    def add(self, key: str, amount: int) -> int:
        while True:
            cur = self.client.get(self._key(key))
            value = int(cur[0]) + amount if cur is not None else amount
            ok, _ = self.client.swap(self._key(key), str(value).encode(), cur[1] if cur else 0)
            if ok:
                return value

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        enc = lambda v: v.encode() if isinstance(v, str) else bytes(v)  # noqa: E731
        cur = self.client.get(self._key(key))
        if (cur is None and enc(expected) == b"") or (cur is not None and cur[0] == enc(expected)):
            ok, now = self.client.swap(self._key(key), enc(desired), cur[1] if cur else 0)
            if ok:
                return enc(desired)
            return now[0] if now else b""
        return cur[0] if cur is not None else enc(expected)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        limit = timeout.total_seconds() if timeout is not None else self.timeout_s
        deadline = time.monotonic() + limit
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd store: {', '.join(keys)} not set within {limit:g}s")
            time.sleep(self.poll_s)


def make_etcd_handler(cfg, seal=lambda backend: backend):
    """torch's dynamic rendezvous handler with its state and store on etcd."""

    rdzv = cfg.rendezvous
    client = etcd_client(cfg, min(REQUEST_S, rdzv.store_timeout_s / 2))
    store = EtcdStore(client, f"/stalwart/store/{rdzv.id}", timeout_s=rdzv.store_timeout_s)
    return DynamicRendezvousHandler.from_backend(
        run_id=rdzv.id,
        store=store,
        backend=seal(EtcdRendezvousBackend(client, rdzv.id)),
        min_nodes=cfg.min_nodes,
        max_nodes=cfg.max_nodes,
        local_addr=rdzv.local_addr or None,
        timeout=RendezvousTimeout(
            join=datetime.timedelta(seconds=rdzv.timeout_s),
            last_call=datetime.timedelta(seconds=rdzv.last_call_s),
            close=datetime.timedelta(seconds=10),
        ),
        keep_alive_interval=max(1, int(rdzv.keepalive_s)),
        keep_alive_max_attempt=3,
    )


def etcd_client(cfg, request_s: float) -> EtcdClient:
    """A client of the run's etcd members (``--rdzv-endpoint``), with its ``--etcd-*`` TLS and user."""
    return EtcdClient(cfg.rendezvous.endpoint, request_s=request_s, access=EtcdAccess.of(cfg.trust))


def etcd_probe(cfg, timeout_s: float):
    """One linearizable read from the etcd cluster (it needs a quorum; raises when none answers)."""
    return etcd_client(cfg, timeout_s).probe
