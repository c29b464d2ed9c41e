"""The job key: one secret that every node of a job holds and no other user can read, and the seals
made with it over everything one agent tells another through a store (docs/security.md).

Where the key comes from, first found wins:

1. ``--job-key-file PATH`` / ``STALWART_JOB_KEY_FILE``: a regular file, ours, mode 0600 or stricter,
   at least 32 bytes (``openssl rand -hex 32``); anything else is refused with the fix;
2. ``STALWART_JOB_KEY`` (a scheduler's secret, a launcher's environment), at least 32 characters;
3. one node: a random key drawn for this run (nothing to set up; nobody else can read it);
4. several nodes, ``--insecure-trusted-network``: a fixed key, so the records are checked for damage
   but anyone who reaches the stores can forge them (every node says so);
5. several nodes: ``$XDG_CONFIG_HOME/stalwart/job.key`` (``~/.config/stalwart/job.key``), made on the
   first run with a fresh random key (0600, in a 0700 directory, by an atomic link so two nodes that
   start together on a shared home read the same key). A home that is not shared gives each host its
   own key: the records then fail on the other hosts, which say to copy the file.

A seal is ``SW1`` + HMAC-SHA256 (hex) over a context and the payload. The context binds a record to
what it is about (its kind, the run id, the round's store, the node), so a record signed for one
purpose, run or round is refused in another. The MAC key is derived per run from the job key, so the
job key itself never signs anything directly. Opening a seal is errors as data: :class:`Opened` or
:class:`Refused` with the reason.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from .errors import ConfigError

KEY_ENV = "STALWART_JOB_KEY"
KEY_FILE_ENV = "STALWART_JOB_KEY_FILE"
MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 4096
MAGIC = b"SW1"
MAC_HEX = 64
INSECURE_SECRET = b"stalwart insecure trusted network: this key is public"
HOW = (
    "give every node the same key: `mkdir -p ~/.config/stalwart && openssl rand -hex 32 > "
    "~/.config/stalwart/job.key && chmod 600 ~/.config/stalwart/job.key` (a shared home does it once), "
    f"or {KEY_FILE_ENV}=PATH, or {KEY_ENV}; on a network and host no one else uses, "
    "--insecure-trusted-network"
)


class KeySource(Enum):
    FILE = "key file"
    ENV = "environment"
    DEFAULT_FILE = "default key file"
    MADE_DEFAULT_FILE = "default key file, made now"
    RUN = "random key for this one-node run"
    INSECURE = "none: trusted network"


@dataclass(frozen=True)
class JobKey:
    secret: bytes
    source: KeySource
    where: str = ""  # the file or variable it came from

    @property
    def insecure(self) -> bool:
        return self.source is KeySource.INSECURE

    def describe(self) -> str:
        return f"{self.source.value} {self.where}".strip()

    def signer(self, run_id: str) -> Signer:
        """The run's seals: a MAC key derived from the job key and the run id."""
        derived = hmac.new(self.secret, b"stalwart control plane v1\0" + run_id.encode(), hashlib.sha256)
        return Signer(derived.digest(), run_id)

    def peer_secret(self, run_id: str) -> bytes:
        """The peer stores' request secret (checkpoint/peer_store.py), never sent anywhere."""
        return hmac.new(self.secret, b"stalwart-peer\n" + run_id.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class Opened:
    payload: bytes


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class Signer:
    """Seals records for one run; a record's context says what it is (``"board/announce|host:port"``)."""

    mac_key: bytes
    run_id: str

    def _mac(self, context: str, payload: bytes) -> bytes:
        msg = self.run_id.encode() + b"\0" + context.encode() + b"\0" + payload
        return hmac.new(self.mac_key, msg, hashlib.sha256).hexdigest().encode()

    def seal(self, context: str, payload: bytes | str) -> bytes:
        data = payload.encode() if isinstance(payload, str) else payload
        return MAGIC + self._mac(context, data) + data

    def open(self, context: str, sealed: bytes | str) -> Opened | Refused:
        raw = sealed.encode() if isinstance(sealed, str) else bytes(sealed)
        if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + MAC_HEX:
            return Refused("not signed")
        mac, payload = raw[len(MAGIC) : len(MAGIC) + MAC_HEX], raw[len(MAGIC) + MAC_HEX :]
        if not hmac.compare_digest(mac, self._mac(context, payload)):
            return Refused("signature does not match this job's key (another key, run, round or purpose)")
        return Opened(payload)


class Refusals:
    """Records that failed their seal: each ignored, counted, and each kind noted once."""

    def __init__(self, note: Callable[[str], None] = lambda text: None) -> None:
        self.count = 0
        self.note = note
        self._said: set[str] = set()

    def refused(self, what: str, why: str) -> None:
        self.count += 1
        if what not in self._said:
            self._said.add(what)
            self.note(
                f"ignored {what}: {why} (logged once; {KEY_FILE_ENV} must name the same key on every node)"
            )


class UnsignedRecord(RuntimeError):
    """A record in a store that is not signed with this job's key (someone else wrote it)."""


class KeyValueStore(Protocol):
    """What :class:`SealedStore` needs of a store: torch's ``torch.distributed.Store`` (TCPStore,
    PrefixStore, the etcd store) and the tests' fakes all have it."""

    # Any: torch's Store.set stub says str; its C++ takes bytes
    def set(self, key: str, value: Any) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...


class SealedStore:
    """A view of a torch ``Store`` (or anything with ``set``/``get``/``check``) whose values are
    sealed on ``set`` and opened on ``get``, each bound to its key and ``bind`` (a round, a run)."""

    def __init__(self, store: KeyValueStore, signer: Signer, refusals: Refusals, bind: str = "") -> None:
        self.store, self.signer, self.refusals, self.bind = store, signer, refusals, bind

    def set(self, key: str, value: bytes | str) -> None:
        self.store.set(key, self.signer.seal(f"{key}|{self.bind}", value))

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check(keys))

    def get(self, key: str) -> bytes:
        """The signed payload under ``key`` (waits as the store's ``get`` does); UnsignedRecord when
        what is there is not signed with this job's key."""
        match self.signer.open(f"{key}|{self.bind}", self.store.get(key)):
            case Opened(payload):
                return payload
            case Refused(reason):
                self.refusals.refused(f"the record {key}", reason)
                raise UnsignedRecord(
                    f"the store holds {key} not signed with this job's key ({reason}): another program "
                    "writes to this job's store, or the nodes hold different job keys"
                )


def default_key_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "stalwart" / "job.key"


def read_key_file(path: Path) -> bytes:
    """The key in ``path``: a regular file of ours (never through a link), 0600 or stricter."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"cannot read the job key file {path}: {exc.strerror}", HOW) from None
    with open(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"the job key file {path} is not a regular file", HOW)
        if st.st_uid != os.geteuid():
            raise ConfigError(
                f"the job key file {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})",
                "use a key file of your own: another user could have written it",
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"the job key file {path} has mode {stat.S_IMODE(st.st_mode):04o}: others could read it",
                f"run `chmod 600 {path}`",
            )
        data = fh.read(MAX_KEY_BYTES + 1).strip()
    if len(data) < MIN_KEY_BYTES or len(data) > MAX_KEY_BYTES:
        raise ConfigError(
            f"the job key in {path} is {len(data)} bytes: it must be {MIN_KEY_BYTES}-{MAX_KEY_BYTES}",
            "write a random key: `openssl rand -hex 32 > FILE`",
        )
    return data


def _private_dir(path: Path) -> None:
    """``path`` as a directory of ours that no one else can write (made 0700 where missing)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ConfigError(
            f"{path} is not a directory of yours that only you can write",
            f"remove it or fix its owner and mode (`chmod 700 {path}`), or set {KEY_FILE_ENV}",
        )


def make_default_key(path: Path) -> bool:
    """Make the default key file if there is none; True when this call made it. Written to a private
    temporary name and linked into place, so a node that loses the race reads the winner's key."""
    try:
        _private_dir(path.parent)
    except OSError as exc:
        raise ConfigError(f"cannot make {path.parent} for the job key: {exc.strerror}", HOW) from None
    tmp = path.with_name(f".job.key.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb") as fh:
            fh.write(secrets.token_hex(32).encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def resolve(
    *, key_file: str = "", insecure: bool = False, multi_node: bool, env: Mapping[str, str] | None = None
) -> JobKey:
    """This job's key (the module docstring says where from); ConfigError with the fix otherwise."""
    values: Mapping[str, str] = os.environ if env is None else env
    if named := key_file or values.get(KEY_FILE_ENV, ""):
        return JobKey(read_key_file(Path(named)), KeySource.FILE, named)
    if value := values.get(KEY_ENV, ""):
        if len(value.encode()) < MIN_KEY_BYTES:
            raise ConfigError(f"{KEY_ENV} is shorter than {MIN_KEY_BYTES} bytes", HOW)
        return JobKey(value.encode(), KeySource.ENV, KEY_ENV)
    if not multi_node:
        return JobKey(secrets.token_bytes(32), KeySource.RUN)
    if insecure:
        return JobKey(INSECURE_SECRET, KeySource.INSECURE)
    path = default_key_path(values)
    made = False if path.exists() else make_default_key(path)
    source = KeySource.MADE_DEFAULT_FILE if made else KeySource.DEFAULT_FILE
    return JobKey(read_key_file(path), source, str(path))


def insecure_warning(node: str) -> str:
    return (
        f"WARNING: node {node} runs without a job key (--insecure-trusted-network): anyone who reaches "
        "the rendezvous or worker store can forge the group's records, and the peer store takes any "
        f"request. Use it only on a network and host no one else uses; otherwise {HOW}."
    )


__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "JobKey",
    "KeySource",
    "Opened",
    "Refused",
    "Refusals",
    "SealedStore",
    "Signer",
    "UnsignedRecord",
    "default_key_path",
    "insecure_warning",
    "make_default_key",
    "read_key_file",
    "resolve",
]
