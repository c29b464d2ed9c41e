"""A node-local memory tier, replicated to a peer node and restored from one.

Under the agent every node has its own memory tier (``<mem dir>/ckpt``, tmpfs). A save commits on
each node a version holding that node's own shard files (and rank 0's DCP metadata on rank 0's
node) with the full manifest. Then each rank sends its files, and each node's leader the manifest
(last, as the commit), to the next node in group-rank order (a ring), whose agent keeps them in its
peer store (``<mem dir>/held``). So every shard is on two nodes.

Restoring a version on a node (its leader, local rank 0, does it; the node's other ranks wait):
take the manifest from this node's memory tier, else from a peer; then every file the manifest
lists comes, first that verifies (size and SHA-256 against the manifest, whose MAC is checked when
a checkpoint key is configured), from: this node's memory tier, the copies this node's agent holds
for other nodes, then each peer in ring order. The version is assembled in this node's memory tier
and loaded from there. Its source is ``memory`` when nothing crossed the network, else ``peer``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..policy.label import Label
from ..protocol.json_collective import JSON, PeerDataError
from .manifest import (
    MANIFEST,
    Manifest,
    encode,
    make_private,
    parse_checked,
    read_manifest,
    verify_files,
    write_durable,
)
from .peer_store import Peer, PeerClient, PeerError, valid_owner
from .store import FileStore, step_name

HELD = "held"
OWN = "ckpt"


@dataclass(frozen=True)
class NodeLink:
    """Where this rank sits among the nodes, and how it reaches their peer stores."""

    local_rank: int = 0
    local_world: int = 1
    node_index: int = 0
    node: str = "local"
    peers: tuple[Peer, ...] = ()  # every node's peer store, in node (group-rank) order
    held: Path | None = None  # this node's agent's copies of other nodes' files
    client: PeerClient | None = None

    @property
    def leader(self) -> bool:
        return self.local_rank == 0

    @property
    def leader_rank_offset(self) -> int:
        """Global rank of this node's leader minus this rank (ranks of a node are contiguous)."""
        return -self.local_rank

    def successor(self) -> Peer | None:
        if self.client is None or len(self.peers) < 2:
            return None
        return self.peers[(self.node_index + 1) % len(self.peers)]

    def others(self) -> list[Peer]:
        """Every other node's peer store, nearest successor first."""
        n = len(self.peers)
        return [self.peers[(self.node_index + i) % n] for i in range(1, n)] if self.client else []


@dataclass(frozen=True)
class Replicated:
    step: int
    peer: str
    files: int
    bytes: int
    duration_s: float
    reason: str = ""


def own_files(version: Path, manifest: Manifest, rank: int) -> list[str]:
    """The files of ``manifest`` this rank wrote (its DCP shards and extras; rank 0: the metadata)."""
    prefix = f"__{rank}_"
    names = [n for n in manifest.files if n.startswith(prefix) or n == f"rank-{rank}.pt"]
    if rank == 0 and ".metadata" in manifest.files:
        names.append(".metadata")
    return sorted(names)


def send_files(link: NodeLink, version: Path, manifest: Manifest, rank: int) -> tuple[int, int, str]:
    """Send this rank's files of ``version`` to the successor node: (files, bytes, reason)."""
    peer = link.successor()
    if peer is None or link.client is None:
        return 0, 0, ""
    sent = size = 0
    try:
        for name in own_files(version, manifest, rank):
            entry = manifest.files[name]
            if entry.sha256 is None:
                return sent, size, f"{name} has no SHA-256 digest"
            link.client.put(peer, link.node, manifest.step, name, version / name, entry.sha256)
            sent += 1
            size += entry.size
    except (PeerError, OSError) as exc:
        return sent, size, str(exc)
    return sent, size, ""


def send_manifest(link: NodeLink, version: Path) -> str:
    """The node leader's commit on the successor: the manifest, after every rank sent its files."""
    peer = link.successor()
    if peer is None or link.client is None:
        return ""
    path = version / MANIFEST
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        step = int(version.name.split("-")[1])
        link.client.put(peer, link.node, step, MANIFEST, path, digest)
    except (PeerError, OSError, ValueError, IndexError) as exc:
        return str(exc)
    return ""


class RestoreSource(Label):
    """Where a node-local version was assembled from: this node's memory alone, or with files (or
    the manifest) fetched from peers. The values are written to the ledger."""

    MEMORY = "memory"
    PEER = "peer"


@dataclass(frozen=True)
class Assembled:
    path: str
    source: RestoreSource | None  # None when not assembled
    reason: str = ""
    fetched: tuple[str, ...] = ()  # "file from node" for each file that crossed the network
    duration_s: float = 0.0

    def to_json(self) -> JSON:
        return {
            "path": self.path,
            "source": self.source.value if self.source is not None else None,
            "reason": self.reason,
            "fetched": list(self.fetched),
            "duration_s": self.duration_s,
        }

    @staticmethod
    def from_json(value: JSON, rank: int) -> Assembled:
        """The record rank ``rank`` sent; PeerDataError for anything else."""
        bad = PeerDataError(f"rank {rank} sent a malformed node restore result")
        if not isinstance(value, dict) or set(value) != {"path", "source", "reason", "fetched", "duration_s"}:
            raise bad
        path, source, reason, fetched, took = (
            value["path"],
            value["source"],
            value["reason"],
            value["fetched"],
            value["duration_s"],
        )
        if not (isinstance(path, str) and isinstance(reason, str) and isinstance(fetched, list)):
            raise bad
        if (
            not all(isinstance(f, str) for f in fetched)
            or not isinstance(took, (int, float))
            or isinstance(took, bool)
        ):
            raise bad
        if source is not None and source not in {s.value for s in RestoreSource}:
            raise bad
        return Assembled(
            path,
            RestoreSource(source) if isinstance(source, str) else None,
            reason,
            tuple(str(f) for f in fetched),
            float(took),
        )


def _held_copy(link: NodeLink, step: int, name: str) -> Path | None:
    if link.held is None or not link.held.is_dir():
        return None
    for owner in sorted(link.held.iterdir()):
        f = owner / step_name(step) / name
        if valid_owner(owner.name) and f.is_file() and not f.is_symlink():
            return f
    return None


def _fetch_manifest(link: NodeLink, step: int, key: bytes | None) -> tuple[Manifest | None, bytes, str, str]:
    """(manifest, its bytes, the node it came from, reason): held copies first, then the peers."""
    reasons = []
    local = _held_copy(link, step, MANIFEST)
    if local is not None:
        data = local.read_bytes()
        manifest, why = parse_checked(data, key)
        if manifest is not None and manifest.step == step:
            return manifest, data, "", ""
        reasons.append(f"held copy: {why or 'for another step'}")
    for peer in link.others():
        try:
            data = link.client.get(peer, step, MANIFEST, 16 << 20)  # type: ignore[union-attr]
        except PeerError as exc:
            reasons.append(str(exc))
            continue
        manifest, why = parse_checked(data, key)
        if manifest is not None and manifest.step == step:
            return manifest, data, peer.node, ""
        reasons.append(f"peer {peer}: manifest {why or 'for another step'}")
    return None, b"", "", "; ".join(reasons) or "no manifest on this node and no peer to ask"


def assemble(link: NodeLink, store: FileStore, step: int, clock=time.perf_counter) -> Assembled:
    """Leader of a node: make ``store``'s version ``step`` complete and verified on this node."""
    t0 = clock()
    final = store.final(step)
    manifest, why = read_manifest(final, store.key) if final.is_dir() else (None, "not on this node")
    data = b""
    fetched: list[str] = []
    if manifest is None:
        manifest, data, came_from, reason = _fetch_manifest(link, step, store.key)
        if manifest is None:
            return Assembled("", None, f"{why}; {reason}")
        if came_from:
            fetched.append(f"{MANIFEST} from {came_from}")
        work = store.begin(step)
    else:
        work = final
    for name in sorted(manifest.files):
        here = verify_files(work, manifest, [name])
        if not here:
            continue
        problems = [f"this node: {here}"] if (work / name).exists() else []
        local = _held_copy(link, step, name)
        if local is not None:
            shutil.copyfile(local, work / name)
            if not (why := verify_files(work, manifest, [name])):
                continue
            problems.append(f"held copy: {why}")
        got = False
        for peer in link.others():
            try:
                body = link.client.get(peer, step, name, manifest.files[name].size)  # type: ignore[union-attr]
            except PeerError as exc:
                problems.append(str(exc))
                continue
            (work / name).write_bytes(body)
            if why := verify_files(work, manifest, [name]):
                problems.append(f"peer {peer}: {why}")
                continue
            fetched.append(f"{name} from {peer.node}")
            got = True
            break
        if not got:
            (work / name).unlink(missing_ok=True)
            if work != final:
                store.discard(step)
            return Assembled(
                "", None, f"{name}: " + ("; ".join(problems) or "no copy on this node or a peer")
            )
    if work != final:
        make_private(work)
        write_durable(work / MANIFEST, data or encode(manifest, store.key), fsync=False)
        os.replace(work, final)
    source = RestoreSource.PEER if fetched else RestoreSource.MEMORY
    return Assembled(str(final), source, "", tuple(fetched), clock() - t0)
