"""The agent's side of the node memory tier: the node's private tmpfs directory and its peer store.

The agent creates it when the job starts and closes it in ``run_job``'s ``finally`` (every exit
path but the agent's own SIGKILL): the peer store stops and the directory is removed. Directory:
``<STALWART_SHM_DIR or /dev/shm>/stalwart-<uid>-<run id>/<node>`` (0700), holding ``ckpt/`` (this
node's memory tier, written by the workers) and ``held/`` (copies of another node's files). When
that predictable name is taken by another user or is a link, the run's directory is a fresh one of
an unpredictable name beside it (``stalwart-<uid>-<run id>-<random>``) and :attr:`NodeMemory.notice`
says why: a plant never turns the memory tier off.

Addresses and the secret reach the agents through the rendezvous store of each round, and the
workers through their environment (``WorkerEnv.mem_dir``/``peers``/``peer_secret``). The secret: with
a checkpoint key configured, HMAC(key, run id), which never travels; otherwise a random secret the
group-rank-0 agent draws for each round and publishes in the rendezvous store (readable by whoever
can read that store: see docs/peer-state.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError
from ..job_key import JobKey, KeySource
from .manifest import KEY_FILE_ENV, MANIFEST, configured_key
from .node_tier import HELD, OWN
from .peer_store import Peer, PeerStore, format_peers
from .private_fs import open_base, open_claimed, open_private, remove_private
from .tiers import default_shm_root, private_dir

NO_KEY = (
    "peer replication is off: the nodes can share its secret only through a checkpoint key "
    f"(the rendezvous store is readable by anyone who reaches it); to turn it on, give every node the "
    f"same key, e.g. `openssl rand -hex 32 > key && chmod 600 key` and {KEY_FILE_ENV}=/path/to/key"
)


def peer_secret_from_key(key: bytes, run_id: str) -> bytes:
    """HMAC(key, run id): the same derivation as the job key's (job_key.JobKey.peer_secret)."""
    return JobKey(key, KeySource.FILE).peer_secret(run_id)


class NodeMemory:
    def __init__(self, *, run_id: str, node: str, host: str | None, secret: bytes | None = None) -> None:
        """``host``: the address to serve peers on (None: one node, no peer store); ``secret``: the peer
        stores' request secret derived from the job key (job_key.py; else from a checkpoint key).

        The run's directory and the node's are opened without following links and must be ours
        and 0700 (:mod:`.private_fs`); a plant is refused with a :class:`CheckpointError`."""
        self.run_id = run_id
        self.node = node
        usual = default_shm_root(run_id)
        base_fd = open_base(usual.parent)
        try:  # the usual name planted by another user: a private, unpredictable one (and why)
            self._run_fd, run, moved = open_claimed(base_fd, usual.parent, usual.name)
        finally:
            os.close(base_fd)
        self.root = run / node
        try:
            # left by an agent that was SIGKILLed: never load another job's leftovers
            remove_private(self._run_fd, node, self.root)
            os.close(open_private(self._run_fd, node, self.root))
            private_dir(self.root / OWN)
        except BaseException:
            os.close(self._run_fd)
            raise
        key = configured_key() if secret is None else None
        self.secret = secret if secret is not None else peer_secret_from_key(key, run_id) if key else b""
        self.store: PeerStore | None = None
        self.peers: tuple[Peer, ...] = ()
        # several nodes but no key: no peer store (the one line the agent shows says how to get one)
        notes = [moved, NO_KEY if host is not None and not self.secret else ""]
        self.notice = "; ".join(n for n in notes if n)
        self._host = host if self.secret else None

    def _serve(self) -> PeerStore:
        """Start the peer store once the first rendezvous bound its own port (so the port the
        peer store is given can never be the rendezvous endpoint's, free until then)."""
        if self.store is None:
            assert self._host is not None
            self.store = PeerStore(
                node=self.node,
                held=self.root / HELD,
                own=self.root / OWN,
                host=self._host,
                secret=self.secret,
            ).start()
        return self.store

    def exchange(self, store, group_rank: int, num_nodes: int) -> None:
        """Publish this node's peer store address (never a secret) in the round's rendezvous store;
        learn every node's address. ``store`` seals what is set and checks what is read
        (job_key.SealedStore): an address someone else planted is refused there."""
        if self._host is None:
            return
        served = self._serve()
        store.set(f"stalwart/peer/{group_rank}", f"{self.node}={served.host}:{served.port}")
        entries = []
        for i in range(num_nodes):
            node, _, addr = store.get(f"stalwart/peer/{i}").decode().partition("=")
            host, _, port = addr.rpartition(":")
            entries.append(Peer(node, host, int(port)))
        self.peers = tuple(entries)

    @property
    def versions_root(self) -> Path:
        """Where this node's memory-tier versions (and the ones being written) are."""
        return self.root / OWN

    def version_dir(self, name: str) -> Path | None:
        """This node's memory-tier copy of version ``name`` (``step-<N>``), if committed here."""
        path = self.root / OWN / name
        return path if (path / MANIFEST).is_file() else None

    def env(self) -> dict[str, str]:
        """The WorkerEnv fields for this node's workers."""
        return {
            "mem_dir": str(self.root),
            "peers": format_peers(self.peers) if len(self.peers) > 1 else "",
            "peer_secret": self.secret.hex() if len(self.peers) > 1 else "",
        }

    def close(self) -> None:
        """Stop the peer store; remove the node's directory through the run directory verified at
        the start (never through a path), and the run's directory once no other node of it is here."""
        try:
            if self.store is not None:
                self.store.stop()
        finally:
            try:
                remove_private(self._run_fd, self.node, self.root)
            except (OSError, CheckpointError):
                pass
            finally:
                os.close(self._run_fd)
            try:
                base_fd = open_base(self.root.parent.parent)
            except CheckpointError:
                return
            try:  # rmdir: only an empty directory, never through a link
                os.rmdir(self.root.parent.name, dir_fd=base_fd)
            except OSError:
                pass
            finally:
                os.close(base_fd)
