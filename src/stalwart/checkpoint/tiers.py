"""Checkpoint tiers: where a checkpoint is persisted, how often, and how many versions are kept.

Tiers, fastest first: ``memory`` (a tmpfs such as /dev/shm: survives a worker crash, not a node
reboot), ``local`` (node-local disk), ``shared`` (a shared filesystem every node mounts) and
``object`` (any fsspec URL: s3://, gs://, memory://, file://). Each has its own interval in steps
and its own retention.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from typing_extensions import assert_never

from ..errors import CheckpointError, ConfigError
from ..policy.label import Label

TierKindName = Literal["memory", "local", "shared", "object"]  # what a configuration spells


class TierKind(Label):
    """What a tier is stored on, fastest first."""

    MEMORY = "memory"
    LOCAL = "local"
    SHARED = "shared"
    OBJECT = "object"

    @property
    def speed(self) -> int:
        """Rank in the speed order: 0 is the fastest."""
        match self:
            case TierKind.MEMORY:
                return 0
            case TierKind.LOCAL:
                return 1
            case TierKind.SHARED:
                return 2
            case TierKind.OBJECT:
                return 3
            case _:
                assert_never(self)


SPEED_ORDER: dict[str, int] = {k.value: k.speed for k in TierKind}


class TierConfig(BaseModel):
    """One tier. ``every_steps``: persist to this tier when at least this many steps passed since
    its last checkpoint. ``keep``: committed versions retained (the newest good one is never
    deleted). ``fsync`` defaults to True except for memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: TierKindName
    location: str
    every_steps: int = Field(default=1, ge=1)
    keep: int = Field(default=2, ge=1)
    fsync: bool | None = None
    node_local: bool = False  # each node has its own directory at ``location`` (see node_tier)

    @field_validator("location")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("location is empty")
        return v

    @property
    def tier_kind(self) -> TierKind:
        return TierKind(self.kind)

    @property
    def durable(self) -> bool:
        """Whether the tier survives the loss of the node's memory."""
        return self.tier_kind is not TierKind.MEMORY

    @property
    def do_fsync(self) -> bool:
        return self.tier_kind is not TierKind.MEMORY if self.fsync is None else self.fsync

    @property
    def is_file(self) -> bool:
        return self.tier_kind is not TierKind.OBJECT

    @property
    def speed(self) -> int:
        """0 for the fastest kind of tier (memory), 3 for the slowest (object)."""
        return self.tier_kind.speed


def validate_tiers(tiers: list[TierConfig]) -> list[TierConfig]:
    """Check names and locations, and return the tiers fastest first."""
    if not tiers:
        raise ConfigError(
            "no checkpoint tier configured", "configure at least one tier (e.g. a local disk path)"
        )
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise ConfigError(f"duplicate checkpoint tier names: {names}", "give every tier a unique name")
    locs = [t.location for t in tiers]
    if len(set(locs)) != len(locs):
        raise ConfigError(
            f"two checkpoint tiers share a location: {locs}", "give every tier its own directory"
        )
    return sorted(tiers, key=lambda t: t.speed)


def default_shm_root(job: str) -> Path:
    """``/dev/shm/stalwart-<uid>-<job>``: directly in the sticky tmpfs, so the only directory another
    user could plant is the tier root itself, which :func:`private_dir` refuses when not ours."""
    return Path(os.environ.get("STALWART_SHM_DIR", "/dev/shm")) / f"stalwart-{os.geteuid()}-{job}"


def check_private(path: Path, *, uid: int | None = None) -> None:
    """Refuse a tier directory that someone else could have written: not a directory, owned by
    another user, or writable by group or others. Raises one CheckpointError saying what to do."""
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CheckpointError(
            f"cannot inspect checkpoint directory {path}: {exc.strerror}",
            "choose a checkpoint location you can create and own",
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(
            f"checkpoint location {path} is not a directory", "choose another checkpoint location"
        )
    if st.st_uid != uid:
        raise CheckpointError(
            f"checkpoint directory {path} is owned by uid {st.st_uid}, not by this user "
            f"(uid {uid}); its files could have been planted",
            "choose another checkpoint location, or remove it or fix its ownership",
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CheckpointError(
            f"checkpoint directory {path} is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); its files could have been planted",
            f"run `chmod go-w {path}` (0700 is best) or choose another checkpoint location",
        )


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents with mode 0700 (whatever the umask), then
    :func:`check_private` it."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        for p in reversed(missing):
            p.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(
            f"cannot create checkpoint directory {path}: {exc.strerror}",
            "choose a checkpoint location you can write",
        ) from None
    check_private(path)
    return path


def default_tiers(
    *,
    local_dir: str | os.PathLike[str],
    job: str = "default",
    base_every_steps: int = 100,
    shared_dir: str | None = None,
    object_url: str | None = None,
    memory: bool = True,
) -> list[TierConfig]:
    """Fast tiers frequent, slow tiers rare: memory every base interval, local disk every 5,
    shared filesystem every 20, object store every 50."""
    b = base_every_steps
    tiers: list[TierConfig] = []
    if memory:
        tiers.append(
            TierConfig(
                name="memory", kind="memory", location=str(default_shm_root(job)), every_steps=b, keep=2
            )
        )
    tiers.append(TierConfig(name="local", kind="local", location=str(local_dir), every_steps=5 * b, keep=2))
    if shared_dir:
        tiers.append(
            TierConfig(name="shared", kind="shared", location=shared_dir, every_steps=20 * b, keep=3)
        )
    if object_url:
        tiers.append(
            TierConfig(name="object", kind="object", location=object_url, every_steps=50 * b, keep=3)
        )
    return validate_tiers(tiers)
