"""Restore time of the same state from the node memory tier, from a peer, and from local disk, all
measured in the same run through the checkpoint engine's ``load_latest``.

    .venv/bin/python bench/bench_peer.py [--mib 256] [--disk DIR] [--repeat 3]

One process plays node ``a``; node ``b``'s peer store runs in the same process on loopback. The
state (``--mib`` of float32 in 16 tensors) is saved once to the node memory tier (replicated to b)
and to a disk tier in ``--disk`` (default: a temporary directory on the working disk). Then:

* memory: a restart on the same node (its memory tier holds the version);
* peer: a replacement node (its memory tier wiped before each repetition) fetching from b;
* disk: a node with no memory tier and no peer, loading the disk tier (baseline). The disk files
  were just written, so they are read from the page cache: a lower bound for a real disk, and far
  below a shared filesystem's time on a cluster.

Every restore verifies SHA-256 digests (the memory/peer assembly checks every file once, the disk
load checks every file once). Prints the best of ``--repeat`` in seconds and GB/s.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from stalwart.checkpoint.engine import CheckpointEngine
from stalwart.checkpoint.node_tier import HELD, OWN, NodeLink
from stalwart.checkpoint.peer_store import Peer, PeerClient, PeerStore
from stalwart.checkpoint.tiers import TierConfig

SECRET = b"bench-secret-0123456789abcdef!!"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--disk", default="")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    shm = Path(tempfile.mkdtemp(prefix="stalwart-bench-peer-", dir="/dev/shm"))
    disk = Path(tempfile.mkdtemp(prefix="stalwart-bench-peer-", dir=args.disk or None))
    stores = {}
    try:
        for n in ("a", "b"):
            (shm / n / OWN).mkdir(parents=True, mode=0o700)
            stores[n] = PeerStore(
                node=n, held=shm / n / HELD, own=shm / n / OWN, host="127.0.0.1", secret=SECRET
            ).start()
        mem = TierConfig(name="memory", kind="memory", location=str(shm / "a" / OWN), keep=1, node_local=True)
        local = TierConfig(name="local", kind="local", location=str(disk / "ckpt"))
        link = NodeLink(
            node="a",
            peers=tuple(Peer(n, s.host, s.port) for n, s in stores.items()),
            held=shm / "a" / HELD,
            client=PeerClient(SECRET, timeout_s=120),
        )
        n = args.mib * (1 << 20) // 4 // 16
        state = {f"t{i}": torch.randn(n) for i in range(16)}
        eng = CheckpointEngine([mem, local], link=link)
        eng.save(1, state, None, force=True)
        eng.close()
        nbytes = sum(t.numel() * 4 for t in state.values())

        def restore(tiers, lk, wipe: bool) -> tuple[float, str]:
            if wipe:
                shutil.rmtree(shm / "a" / OWN)
                (shm / "a" / OWN).mkdir(mode=0o700)
            target = {k: torch.empty_like(v) for k, v in state.items()}
            e = CheckpointEngine(tiers, link=lk)
            t0 = time.perf_counter()
            found = e.load_latest(target)
            dt = time.perf_counter() - t0
            e.close()
            assert found is not None and all(torch.equal(target[k], state[k]) for k in state)
            return dt, found.tier

        kinds = {
            "memory": ([mem, local], link, False),
            "disk": ([local], None, False),
            "peer": ([mem, local], link, True),
        }
        restore([local], None, False)  # warm-up: imports and first-use costs land in no figure
        runs: dict[str, list[tuple[float, str]]] = {k: [] for k in kinds}
        for _ in range(args.repeat):  # interleaved, so a noisy neighbour hits every kind alike
            for name, (tiers, lk, wipe) in kinds.items():
                runs[name].append(restore(tiers, lk, wipe))
                if wipe:  # leave the node's memory complete again for the next "memory" restore
                    restore(tiers, lk, False)
        results = {}
        for name, got in runs.items():
            best = min(r[0] for r in got)
            results[name] = best
            print(f"{name:7s} tier={got[0][1]:7s} best {best:.3f} s  {nbytes / best / 1e9:.2f} GB/s")
        print(f"state {nbytes / 1e6:.0f} MB; peer/memory {results['peer'] / results['memory']:.2f}x, "
              f"disk/memory {results['disk'] / results['memory']:.2f}x")  # fmt: skip
    finally:
        for s in stores.values():
            s.stop()
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)


if __name__ == "__main__":
    main()
