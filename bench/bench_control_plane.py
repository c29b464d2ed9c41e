"""The control plane at scale on one machine: N agents' real rendezvous and in-place boards in one
process (issue 39, point 4), at 16, 64 and 256 agents by default.

Each agent is Stalwart's own code without its workers (which would each import torch and start a
process): its rendezvous handler (``launch/rendezvous/node_rendezvous.make_handler``: torch's
dynamic rendezvous on the first agent's c10d TCPStore, its state sealed with the job key) and, once
the round formed, its in-place board (``launch/inplace/board.StoreBoard`` on a worker TCPStore, on
its own poll thread as in the agent: heartbeat, version reads, liveness line). The first agent's
board watches every other (as the first node of a group does). Measured per size:

* **rendezvous**: from the moment every agent called ``next_rendezvous`` to the last one's answer;
* **store load**: the worker store calls every board makes in 10 s of quiet training (counted on
  each board's own store client), as operations per second, in all and per agent;
* **first node's poll**: the mean time of one poll of the watching board (it reads N-1 liveness
  connections each 0.1 s; its store calls do not grow with N while nothing fails);
* **death to verdict**: one agent's process death (its liveness sockets closed without a goodbye,
  as the kernel does for a killed process) until the first node's board counts it dead;
* **memory**: the process's resident memory growth per agent (threads, sockets, store clients).

Not measured here: the workers, the process groups, the heartbeat-bound verdict of a silent host
(by design the bound, 2.5 s by default), and where the rendezvous's time goes (bench/rdzv_scale.py:
its compare-and-set attempts and losses, bytes, seal and pickle time, with the agents split over
processes, and torch's keep-alive load once the round formed). Run:
.venv/bin/python bench/bench_control_plane.py [--sizes 16,64,256] [--rendezvous-max 64] [--json out]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from torch.distributed import TCPStore

from stalwart.job_key import JobKey, KeySource, Refusals
from stalwart.launch.inplace.board import StoreBoard
from stalwart.launch.rendezvous.node_rendezvous import make_handler
from stalwart.launch.rendezvous.sealed import SealedBackend
from stalwart.settings.run_config import RunConfig

KEY = JobKey(b"b" * 32, KeySource.FILE)


class Counting:
    """A store client that counts its calls (the bench's view of a board's load)."""

    def __init__(self, store: Any) -> None:
        self._store, self.calls = store, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            return attr(*args, **kw)

        return call


class CountedBoard(StoreBoard):
    """A board whose store client counts its calls, and whose poll is timed."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.counted: Counting | None = None
        self.poll_s: list[float] = []
        super().__init__(*args, **kw)

    def poll(self) -> None:
        t0 = time.perf_counter()
        if self._store is None:
            self._store = TCPStore(
                self._addr, self._port, None, False, timeout=self._timeout, wait_for_workers=False
            )
            self.counted = Counting(self._store)
        try:
            assert self.counted is not None
            self._exchange(self.counted)
        except Exception:  # noqa: BLE001 - as the real poll: try again on a new connection
            self._store = None
        self.poll_s.append(time.perf_counter() - t0)

    def die(self) -> None:
        """What the kernel does when the agent's process dies: its sockets closed, no goodbye."""
        self._stop.set()
        line = self._line
        if line is not None:
            for conn in line._held:
                conn.close()
            line._sock.close()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rendezvous(n: int, port: int, work: Path) -> float:
    """N agents' first round on one c10d store: all joined -> the last answer, in seconds."""
    signer = KEY.signer("bench-cp")
    handlers = []
    for i in range(n):
        cfg = RunConfig(
            script="x.py", run_dir=work / f"run-{i}", run_id="bench-cp", rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id="bench-cp", rdzv_host=i == 0, nnodes=str(n),
            node_name=f"n{i}", rdzv_last_call_s=1.0,
        )  # fmt: skip
        refusals = Refusals(lambda text: None)
        handlers.append(make_handler(cfg, lambda b, s=signer, r=refusals: SealedBackend(b, s, r)))
    joined: list[float] = []
    done: list[float] = []
    lock = threading.Lock()

    def agent(h: Any) -> None:
        with lock:
            joined.append(time.time())
        h.next_rendezvous()
        with lock:
            done.append(time.time())

    threads = [threading.Thread(target=agent, args=(h,), daemon=True) for h in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    if len(done) != n:
        raise RuntimeError(f"only {len(done)} of {n} agents got a rank")
    return max(done) - max(joined)


def boards(n: int, quiet_s: float) -> dict[str, float]:
    store = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    signer = KEY.signer("bench-cp")
    others = [f"n{i}" for i in range(1, n)]
    rss0 = _rss_mb()
    made = [
        CountedBoard(
            "127.0.0.1",
            store.port,
            30.0,
            node=f"n{i}",
            watch=others if i == 0 else (),
            signer=signer,
            live_host="127.0.0.1",
        )  # fmt: skip
        for i in range(n)
    ]
    first = made[0]
    deadline = time.monotonic() + 120
    while len(first._watch._held) < n - 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the first node dials every line (a lookup every 0.5 s until held)
    held = len(first._watch._held)
    before = [b.counted.calls if b.counted else 0 for b in made]
    first.poll_s.clear()
    time.sleep(quiet_s)
    after = [b.counted.calls if b.counted else 0 for b in made]
    ops = sum(a - b for a, b in zip(after, before, strict=True)) / quiet_s
    poll = statistics.mean(first.poll_s) if first.poll_s else float("nan")
    victim = made[n // 2]
    t0 = time.monotonic()
    victim.die()
    while victim._node not in first.dead() and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    verdict = time.monotonic() - t0
    rss = (_rss_mb() - rss0) / n
    for b in made:
        b.close()
    return {
        "held": held,
        "ops_per_s": ops,
        "ops_per_s_per_agent": ops / n,
        "first_poll_ms": poll * 1000,
        "death_to_verdict_s": verdict,
        "rss_mb_per_agent": rss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,64,256")
    ap.add_argument("--quiet-s", type=float, default=10.0)
    ap.add_argument(
        "--rendezvous-max", type=int, default=1 << 20, help="skip the rendezvous above this many agents"
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        rdzv = float("nan")
        if n <= args.rendezvous_max:
            with tempfile.TemporaryDirectory() as tmp:
                probe = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
                port = probe.port
                del probe  # the first agent hosts the rendezvous store on this port
                rdzv = rendezvous(n, port, Path(tmp))
        row = {"agents": n, "rendezvous_s": rdzv, **boards(n, args.quiet_s)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
