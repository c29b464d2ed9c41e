"""Checkpoint manifest: what a committed checkpoint holds, with sizes, SHA-256 digests and a MAC.

The manifest is written last, atomically (write to a temp file, fsync, rename, fsync the
directory). A checkpoint directory without a valid manifest is never loaded. Everything read back
is untrusted: the manifest is parsed by a strict pydantic model with size limits, and anything that
does not fit (wrong JSON shape, wrong types, unknown keys, huge numbers, file names that are paths)
makes the version "bad", never an exception out of verification.

Integrity: each file carries its SHA-256. That detects corruption (bit flips, torn or truncated
writes) but not tampering, because whoever can write the directory can recompute the digests.
When a key is configured (``STALWART_CHECKPOINT_KEY_FILE`` naming a file, or
``STALWART_CHECKPOINT_KEY``), the manifest also carries an HMAC-SHA256 over its canonical JSON,
checked before any data file is read, so a version written without the key is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import CheckpointError
from ..secret_values import read_secret_bytes

MANIFEST = "MANIFEST.json"
FORMAT: Final = "stalwart-checkpoint"
VERSION: Final = 2
KEY_ENV = "STALWART_CHECKPOINT_KEY"
KEY_FILE_ENV = "STALWART_CHECKPOINT_KEY_FILE"
MAX_MANIFEST_BYTES = 16 << 20  # a manifest of 100k files is ~15 MB; anything larger is not ours
MAX_FILES = 100_000
MAX_FILE_BYTES = 1 << 50  # 1 PiB per file
MAX_STEP = 10**9 - 1  # version directories are step-<9 digits>
MAX_WORLD = 1 << 20
MIN_KEY_BYTES = 16
_CHUNK = 4 << 20
_STEP_DIR = re.compile(r"^step-(\d{9})$")

Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class FileEntry(BaseModel):
    """Size and digest of one file: SHA-256 (version 2, written now) or CRC32 (version 1, read only
    so that checkpoints from before the upgrade still resume when no key is configured)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    size: int = Field(ge=0, le=MAX_FILE_BYTES)
    sha256: Hex64 | None = None
    crc32: int | None = Field(default=None, ge=0, le=0xFFFFFFFF)

    @model_validator(mode="after")
    def _one_digest(self) -> FileEntry:
        if (self.sha256 is None) == (self.crc32 is None):
            raise ValueError("a file entry needs exactly one of sha256 and crc32")
        return self


def _check_name(name: str) -> str:
    """A file name inside the version directory: never a path, never the manifest itself."""
    if not name or len(name) > 255 or name in (".", "..", MANIFEST):
        raise ValueError(f"file name {name[:80]!r} is not allowed")
    if any(c in name for c in "/\\\0") or not name.isprintable():
        raise ValueError(f"file name {name[:80]!r} is a path or holds control characters")
    return name


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    step: int = Field(ge=0, le=MAX_STEP)
    world_size: int = Field(ge=1, le=MAX_WORLD)
    files: dict[str, FileEntry] = Field(max_length=MAX_FILES)
    created: float
    meta: dict[str, JsonValue] = Field(default_factory=dict, max_length=256)
    format: Literal["stalwart-checkpoint"] = FORMAT
    version: Literal[1, 2] = VERSION
    mac: Hex64 | None = None

    @model_validator(mode="after")
    def _digests_match_version(self) -> Manifest:
        legacy = self.version == 1
        if any((e.crc32 is not None) != legacy for e in self.files.values()):
            raise ValueError(
                f"version {self.version} manifests carry {'crc32' if legacy else 'sha256'} digests only"
            )
        if legacy and self.mac is not None:
            raise ValueError("version 1 manifests have no MAC")
        return self

    @field_validator("files")
    @classmethod
    def _names(cls, v: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in v:
            _check_name(name)
        return v

    @field_validator("created")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("created is not a finite number")
        return v

    def body(self) -> bytes:
        """The canonical bytes the MAC covers: every field except ``mac``, sorted, compact."""
        return json.dumps(
            self.model_dump(mode="json", exclude={"mac"}, exclude_none=True),
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        ).encode()

    def signed(self, key: bytes | None) -> Manifest:
        """This manifest with its MAC set (or cleared when there is no key)."""
        mac = hmac.new(key, self.body(), hashlib.sha256).hexdigest() if key else None
        return self.model_copy(update={"mac": mac})

    def mac_problem(self, key: bytes | None) -> str:
        """ "" if the MAC checks out (or no key is configured), else why not."""
        if not key:
            return ""
        if self.mac is None:
            return "manifest has no MAC but a checkpoint key is configured (written without the key)"
        if not hmac.compare_digest(self.mac, hmac.new(key, self.body(), hashlib.sha256).hexdigest()):
            return "manifest MAC does not match (tampered, or written with another key)"
        return ""

    def to_json(self) -> str:
        return json.dumps(
            self.model_dump(mode="json", exclude_none=True), indent=1, sort_keys=True, allow_nan=False
        )

    @staticmethod
    def from_json(data: str | bytes) -> Manifest:
        """Parse untrusted text; raise ValueError with a one-line reason for anything malformed."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest is {len(data)} bytes, more than the {MAX_MANIFEST_BYTES} allowed")
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"manifest is not UTF-8 (byte {exc.start})") from None
        try:
            return Manifest.model_validate_json(data, strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "top level"
            more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            raise ValueError(f"malformed manifest at {where}: {first['msg']}{more}") from None


def configured_key(env: Mapping[str, str] | None = None) -> bytes | None:
    """The checkpoint MAC key from the environment, or None. A key file wins over the variable."""
    values: Mapping[str, str] = os.environ if env is None else env
    if path := values.get(KEY_FILE_ENV):
        key = read_secret_bytes(path, "checkpoint key", CheckpointError)  # ours, 0600, not a link
        source = f"key file {path}"
    elif value := values.get(KEY_ENV):
        key, source = value.encode(), KEY_ENV
    else:
        return None
    if len(key) < MIN_KEY_BYTES:
        raise CheckpointError(
            f"checkpoint key from {source} is {len(key)} bytes, shorter than {MIN_KEY_BYTES}",
            "use a random key of at least 32 bytes, e.g. `openssl rand -hex 32`",
        )
    return key


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def crc32_file(path: Path) -> int:
    """The version 1 digest, for reading checkpoints written before SHA-256."""
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: temp file (0600), fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def make_private(version: Path) -> None:
    """Every file of a version directory 0600, whatever the umask it was written under (torch's
    writer and ``write_bytes`` leave 0644 under the usual 022): the docs promise private files."""
    for f in version.iterdir():
        if f.is_file() and not f.is_symlink():
            f.chmod(0o600)


def encode(manifest: Manifest, key: bytes | None) -> bytes:
    """The bytes to commit: the manifest signed with ``key`` (if any)."""
    return manifest.signed(key).to_json().encode()


def parse_checked(data: bytes, key: bytes | None) -> tuple[Manifest | None, str]:
    """Parse and MAC-check manifest bytes: ``(manifest, "")`` or ``(None, reason)``."""
    try:
        manifest = Manifest.from_json(data)
    except ValueError as exc:
        return None, f"unreadable manifest: {exc}"
    if problem := manifest.mac_problem(key):
        return None, problem
    return manifest, ""


def read_manifest(directory: Path, key: bytes | None = None) -> tuple[Manifest | None, str]:
    """Read and check ``directory``'s manifest (its MAC too when ``key`` is given). In a version
    directory (``step-<N>``) the manifest must be for step N: a signed version copied under a newer
    name is a replay, not a newer checkpoint."""
    mpath = directory / MANIFEST
    try:
        if not mpath.is_file():
            return None, "no manifest (save never committed)"
        with open(mpath, "rb") as fh:
            data = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        return None, f"unreadable manifest: {exc.strerror or exc}"
    manifest, reason = parse_checked(data, key)
    named = _STEP_DIR.match(directory.name)
    if manifest is not None and named and int(named.group(1)) != manifest.step:
        return None, f"manifest is for step {manifest.step} but sits in {directory.name} (copied or renamed)"
    return manifest, reason


def verify_files(
    directory: Path, manifest: Manifest, names: list[str] | None = None, *, checksums: bool = True
) -> str:
    """Check the listed files (all by default); return "" if intact, else the first reason."""
    for name in sorted(manifest.files) if names is None else names:
        entry = manifest.files[name]
        f = directory / name
        try:
            if not f.is_file() or f.is_symlink():
                return f"missing file {name}" if not f.exists() else f"{name} is not a regular file"
            size = f.stat().st_size
            if size != entry.size:
                return f"{name} has {size} bytes, manifest says {entry.size} (truncated or torn)"
            if checksums and entry.sha256 is not None and (digest := sha256_file(f)) != entry.sha256:
                return f"{name} checksum (SHA-256) {digest[:16]}... != {entry.sha256[:16]}... (corrupted)"
            if checksums and entry.crc32 is not None and (crc := crc32_file(f)) != entry.crc32:
                return f"{name} checksum (CRC32) {crc:#010x} != {entry.crc32:#010x} (corrupted)"
        except OSError as exc:
            return f"cannot read {name}: {exc.strerror or exc}"
    return ""


def verify(directory: Path, key: bytes | None | Literal["env"] = "env") -> tuple[Manifest | None, str]:
    """Return ``(manifest, "")`` if every listed file is present and intact, else ``(None, reason)``.
    The MAC is checked with ``key``, by default the key configured in the environment (if any)."""
    manifest, reason = read_manifest(directory, configured_key() if key == "env" else key)
    if manifest is None:
        return None, reason
    reason = verify_files(directory, manifest)
    return (manifest, "") if not reason else (None, reason)
