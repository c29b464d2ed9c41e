"""Where the rendezvous's time goes at N agents (issue 39, point 4), with the agents split over
processes: ``--agents 64 --procs 8`` runs 8 processes of 8 agent threads, ``--procs 64`` one process
per agent (what a cluster of one host per agent pays, less the network), ``--procs 1`` the one
interpreter of bench_control_plane.py.

Each agent is Stalwart's rendezvous handler (``launch/rendezvous/node_rendezvous.make_handler``:
torch's dynamic rendezvous on the first agent's c10d TCPStore, its state sealed with the job key by
``SealedBackend``), with the bench's counters between the seal and the store and around the seal:

* **CAS**: torch's compare-and-set writes of the whole state (``set_state``), and how many lost
  (another agent wrote first: torch re-reads the state it got back and tries again at once);
* **reads**: ``get_state`` calls (torch's SYNC poll: it sleeps 1 s, then reads, while it waits);
* **bytes**: the sealed state per write, and all bytes of state moved (a c10d CAS sends the expected
  and the new value, base64, and gets the stored one back);
* **seal / open**: the HMAC (thread CPU seconds), and **pickle**: torch's dumps per write and loads per
  answer, estimated from the bytes it handled at the throughput measured on the final state;
* **CPU**: the agent threads' own CPU time and each process's CPU (user + system, the TCPStore server's
  threads included in the first process) against the wall time.

The round: ``--nnodes N`` (min = max), from the moment every agent called ``next_rendezvous`` to the
last one's answer. After it, ``--quiet-s`` seconds of the formed round measure torch's keep-alive
load on the store (every agent CASes the whole state every keep-alive interval, 1 s by default).

``--handler stalwart`` times Stalwart's own handler instead (``--rdzv-backend stalwart``,
launch/rendezvous/round_rendezvous.py) on the same store, its store calls counted between the
handler and the TCPStore: **ops** (every call), **writes** (set, compare-and-set, add of a non-zero
amount), **bytes** (keys and values sent and received); for torch's, ops are its state's reads and
compare-and-sets and writes its compare-and-sets. ``--poll-s S`` makes every agent call
``num_nodes_waiting`` every S seconds during the quiet seconds, as a running agent polls it (torch's
reads the whole state when its one-second sync interval has passed; Stalwart's is one ``add(..., 0)``).
Each process's peak RSS (ru_maxrss) is reported, and per agent.

``--handler etcd`` times torch's dynamic rendezvous on Stalwart's etcd backend instead
(``--rdzv-backend etcd``, launch/rendezvous/etcd.py: the same sealed state, kept in one etcd key and
swapped against its revision), on one etcd member on loopback that the bench starts (Debian's
``etcd-server``; tests/etcdutil.py); its counters are torch's, as for ``torch``.

``--cycle 1000,4000`` instead times one uncontended keep-alive write (read, open, unpickle, beat,
pickle, seal, compare-and-set) of a state of that many participants on a loopback store, and one of
torch's event records: what bounds the writes per second a group can make on the one key.
``RDZV_SCALE_PROFILE=1`` runs every agent thread under cProfile (slower) and prints the merged profile.

Run: PYTHONPATH=src .venv/bin/python bench/rdzv_scale.py --agents 16 [--procs 1] [--quiet-s 10]
[--handler torch|stalwart|etcd] [--poll-s 0] [--deadline-s 600] [--json out] | --cycle 1000,4000
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pickle
import pstats
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from torch.distributed import Store, TCPStore
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from stalwart.job_key import JobKey, KeySource, Refusals, Signer
from stalwart.launch.rendezvous.node_rendezvous import make_handler
from stalwart.launch.rendezvous.sealed import SealedBackend
from stalwart.settings.run_config import RunConfig

KEY = JobKey(b"b" * 32, KeySource.FILE)
RUN = "bench-scale"
BACKENDS = {"torch": "c10d", "stalwart": "stalwart", "etcd": "etcd"}  # --handler -> --rdzv-backend
PROFILE = os.environ.get("RDZV_SCALE_PROFILE") == "1"  # cProfile every agent thread (slows it)


@dataclass
class Stats:
    """One process's counters (summed over processes by the parent)."""

    cas: int = 0
    lost: int = 0
    reads: int = 0
    sealed_bytes_written: int = 0  # the sealed state of every CAS attempt
    wire_bytes: int = 0  # state bytes moved: CAS expected + new + answer, read answers (base64)
    seal_s: float = 0.0
    open_s: float = 0.0
    plain_dumped: int = 0  # torch's pickle.dumps output per write
    plain_loaded: int = 0  # torch's pickle.loads input per answer
    state_bytes: int = 0  # the newest sealed state's size
    ops: int = 0  # store calls (torch's: its state's reads and compare-and-sets)
    writes: int = 0  # store calls that write (set, compare-and-set, add of a non-zero amount)

    def minus(self, other: Stats) -> Stats:
        return Stats(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(Stats)))


class CountingBackend(RendezvousBackend):
    """Between the seal and the store: counts what torch's state costs on the wire."""

    def __init__(self, inner: RendezvousBackend, stats: Stats, lock: threading.Lock) -> None:
        self.inner, self.stats, self.lock = inner, stats, lock

    @property
    def name(self) -> str:
        return self.inner.name

    def get_state(self) -> tuple[bytes, Token] | None:
        got = self.inner.get_state()
        with self.lock:
            self.stats.reads += 1
            self.stats.ops += 1
            if got is not None:
                self.stats.wire_bytes += _answer_bytes(got[0], got[1])
        return got

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        got = self.inner.set_state(state, token)
        with self.lock:
            s = self.stats
            s.cas += 1
            s.ops += 1
            s.writes += 1
            s.sealed_bytes_written += len(state)
            s.state_bytes = len(state)
            s.wire_bytes += (len(token) if isinstance(token, bytes) else 0) + (len(state) * 4 + 2) // 3
            if got is not None:
                s.wire_bytes += _answer_bytes(got[0], got[1])
                s.lost += 0 if got[2] else 1
        return got


def _answer_bytes(state: bytes, token: Token) -> int:
    """The state an answer carries: c10d's token is the stored (base64) bytes themselves; etcd's is a
    revision number, and the value comes base64 in its JSON answer."""
    return len(token) if isinstance(token, bytes) else (len(state) * 4 + 2) // 3


def _size(value: Any) -> int:  # Any: a key, a value (str or bytes) or a list of them
    if isinstance(value, list | tuple):
        return sum(_size(v) for v in value)
    return len(value) if isinstance(value, bytes | str) else 8


class CountingStore(Store):
    """Between Stalwart's handler and the TCPStore: every call, write and byte counted."""

    def __init__(self, inner: TCPStore, stats: Stats, lock: threading.Lock) -> None:
        super().__init__()
        self.inner, self.stats, self.lock = inner, stats, lock

    def _count(self, write: bool, *moved: Any) -> None:  # Any: keys and values
        with self.lock:
            self.stats.ops += 1
            self.stats.writes += int(write)
            self.stats.wire_bytes += sum(_size(m) for m in moved)

    def set(self, key: str, value: Any) -> None:  # Any: bytes (torch's stub says str)
        self.inner.set(key, value)
        self._count(True, key, value)

    def get(self, key: str) -> bytes:
        got = self.inner.get(key)
        self._count(False, key, got)
        return got

    def add(self, key: str, value: int) -> int:
        got = self.inner.add(key, value)
        self._count(value != 0, key, got)
        return got

    def check(self, keys: list[str]) -> bool:
        got = self.inner.check(keys)
        self._count(False, keys)
        return got

    def wait(self, keys: list[str], timeout: Any = None) -> None:  # Any: a timedelta
        try:
            self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)
        finally:
            self._count(False, keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        got = self.inner.multi_get(keys)
        self._count(False, keys, got)
        return got

    def multi_set(self, keys: list[str], values: list[Any]) -> None:  # Any: bytes, as set
        self.inner.multi_set(keys, values)
        self._count(True, keys, values)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:  # Any: bytes, as set
        got = self.inner.compare_set(key, expected, desired)
        self._count(True, key, expected, desired, got)
        with self.lock:
            self.stats.cas += 1
            self.stats.lost += int(got != desired)
        return got


class TimedSigner:
    """The run's Signer, its seal and open timed in the calling thread's CPU time."""

    def __init__(self, signer: Signer, stats: Stats, lock: threading.Lock) -> None:
        self.signer, self.stats, self.lock = signer, stats, lock

    # Any: Signer.open's Opened | Refused, passed through
    def open(self, context: str, sealed: bytes | str) -> Any:
        t0 = time.thread_time()
        got = self.signer.open(context, sealed)
        with self.lock:
            self.stats.open_s += time.thread_time() - t0
        return got

    def seal(self, context: str, payload: bytes | str) -> bytes:
        t0 = time.thread_time()
        got = self.signer.seal(context, payload)
        with self.lock:
            self.stats.seal_s += time.thread_time() - t0
        return got


class CountedSeal(SealedBackend):
    """Stalwart's SealedBackend, the plain bytes torch pickles and unpickles counted."""

    def __init__(self, inner: RendezvousBackend, signer: Any, refusals: Refusals, stats: Stats) -> None:
        super().__init__(inner, signer, refusals)
        self.stats = stats

    def get_state(self) -> tuple[bytes, Token] | None:
        got = super().get_state()
        self.stats.plain_loaded += len(got[0]) if got else 0
        return got

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        self.stats.plain_dumped += len(state)
        got = super().set_state(state, token)
        self.stats.plain_loaded += len(got[0]) if got else 0
        return got


def _agents(first: int, count: int, n: int, port: int, work: Path, stats: Stats, kind: str) -> list[Any]:
    lock = threading.Lock()
    signer = TimedSigner(KEY.signer(RUN), stats, lock)
    handlers = []
    for i in range(first, first + count):
        cfg = RunConfig(
            script="x.py", run_dir=work / f"run-{i}", run_id=RUN, rdzv_backend=BACKENDS[kind],
            rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id=RUN, rdzv_host=i == 0 and kind != "etcd", nnodes=str(n),
            node_name=f"n{i}", rdzv_last_call_s=1.0,
        )  # fmt: skip
        refusals = Refusals(lambda text: print(text, file=sys.stderr, flush=True))

        def seal(b: RendezvousBackend, r: Refusals = refusals) -> CountedSeal:
            return CountedSeal(CountingBackend(b, stats, lock), signer, r, stats)

        handler = make_handler(cfg, seal, signer=signer, refusals=refusals)  # type: ignore[arg-type]
        if kind == "stalwart":
            handler.store = CountingStore(handler.store, stats, lock)
        handlers.append(handler)
    return handlers


def _rss_kb() -> int:
    """This process's resident set now, in KiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _pickle_s_per_byte(state: bytes) -> tuple[float, float]:
    """torch's pickle.dumps and loads CPU seconds per byte of its state, on the given state."""
    obj = pickle.loads(state)
    reps = max(1, 2_000_000 // max(1, len(state)))
    t0 = time.thread_time()
    for _ in range(reps):
        pickle.dumps(obj)
    t1 = time.thread_time()
    for _ in range(reps):
        pickle.loads(state)
    t2 = time.thread_time()
    return (t1 - t0) / reps / len(state), (t2 - t1) / reps / len(state)


def child(
    first: int, count: int, n: int, port: int, quiet_s: float, deadline_s: float, kind: str, poll_s: float
) -> None:
    """One process's agents; talks to the parent by lines on stdin/stdout."""
    stats = Stats()
    with tempfile.TemporaryDirectory() as tmp:
        base_kb = _rss_kb()  # after the imports, before the agents
        handlers = _agents(first, count, n, port, Path(tmp), stats, kind)
        print("ready", flush=True)
        assert sys.stdin.readline().strip() == "go"
        joined: list[float] = []
        done: list[float] = []
        cpu: list[float] = []
        lock = threading.Lock()

        profiles: list[cProfile.Profile] = []

        def agent(h: Any) -> None:
            t0 = time.thread_time()
            with lock:
                joined.append(time.time())
            if PROFILE:  # each agent thread under its own profiler, merged at the end
                prof = cProfile.Profile()
                profiles.append(prof)
                prof.runcall(h.next_rendezvous)
            else:
                h.next_rendezvous()
            with lock:
                done.append(time.time())
                cpu.append(time.thread_time() - t0)

        c0, w0 = os.times(), time.time()
        threads = [threading.Thread(target=agent, args=(h,), daemon=True) for h in handlers]
        for t in threads:
            t.start()
        end = time.monotonic() + deadline_s
        while any(t.is_alive() for t in threads) and time.monotonic() < end:
            alive = next(t for t in threads if t.is_alive())
            alive.join(timeout=min(10.0, max(0.0, end - time.monotonic())))
            if any(t.is_alive() for t in threads):  # progress, while the round forms
                s = stats
                at = f"{time.time() - w0:.0f} s"
                print(f"[{first}] {at}: {len(done)}/{count} done, cas {s.cas} lost {s.lost} reads {s.reads}"
                      f" state {s.state_bytes} B, cpu {sum(os.times()[:2]) - c0.user - c0.system:.1f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        c1, w1 = os.times(), time.time()
        join = Stats(**asdict(stats))
        if profiles:
            merged = pstats.Stats(profiles[0], stream=sys.stderr)
            for prof in profiles[1:]:
                merged.add(prof)
            merged.sort_stats("tottime").print_stats(25)
            merged.sort_stats("cumulative").print_stats(40)
        state = handlers[0]._state_holder._backend.last or b"" if kind != "stalwart" else b""
        dump_pb, load_pb = _pickle_s_per_byte(state) if state else (0.0, 0.0)
        out: dict[str, Any] = {
            "joined": joined, "done": done, "agent_cpu_s": sum(cpu),
            "proc_cpu_s": (c1.user + c1.system) - (c0.user + c0.system), "proc_wall_s": w1 - w0,
            "join": asdict(join), "pickle_s": join.plain_dumped * dump_pb + join.plain_loaded * load_pb,
            "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "base_kb": base_kb,
        }  # fmt: skip
        print(json.dumps(out), flush=True)
        if len(done) == count and sys.stdin.readline().strip() == "quiet":
            stop = threading.Event()

            def poll(h: Any) -> None:  # Any: either handler
                while not stop.wait(poll_s):
                    h.num_nodes_waiting()

            pollers = [threading.Thread(target=poll, args=(h,), daemon=True) for h in handlers if poll_s > 0]
            before, c0 = Stats(**asdict(stats)), os.times()
            for t in pollers:
                t.start()
            time.sleep(quiet_s)
            quiet, c1 = stats.minus(before), os.times()
            stop.set()
            q_pickle = quiet.plain_dumped * dump_pb + quiet.plain_loaded * load_pb
            out = {"quiet": asdict(quiet), "quiet_pickle_s": q_pickle}
            out["quiet_cpu_s"] = (c1.user + c1.system) - (c0.user + c0.system)
            print(json.dumps(out), flush=True)
            sys.stdin.readline()  # "exit": the first process hosts the store, it leaves last
    os._exit(0)


def run(n: int, procs: int, quiet_s: float, deadline_s: float, kind: str, poll_s: float) -> dict[str, Any]:
    if kind != "etcd":
        return _run(n, procs, quiet_s, deadline_s, kind, poll_s, 0)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from etcdutil import etcd_member  # deferred: only this arm (a test helper: starts and reaps etcd)

    with tempfile.TemporaryDirectory() as tmp, etcd_member(Path(tmp) / "etcd", name="bench") as endpoint:
        return _run(n, procs, quiet_s, deadline_s, kind, poll_s, int(endpoint.rpartition(":")[2]))


def _free_store_port() -> int:
    probe = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    port = probe.port
    del probe  # the first agent hosts the rendezvous store on this port
    return port


def _run(
    n: int, procs: int, quiet_s: float, deadline_s: float, kind: str, poll_s: float, port: int
) -> dict[str, Any]:
    port = port or _free_store_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    share = [n // procs + (1 if p < n % procs else 0) for p in range(procs)]
    kids, first = [], 0
    for count in share:
        spec = f"{first},{count},{n},{port},{quiet_s},{deadline_s},{kind},{poll_s}"
        argv = [sys.executable, __file__, "--child", spec]
        kids.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
        first += count
        if first == count:  # the host's process first, so the others find its store
            assert kids[0].stdout is not None and kids[0].stdout.readline().strip() == "ready"
    for k in kids[1:]:
        assert k.stdout is not None and k.stdout.readline().strip() == "ready"

    def say(word: str) -> None:
        for k in kids:
            assert k.stdin is not None
            try:
                k.stdin.write(word + "\n")
                k.stdin.flush()
            except BrokenPipeError:  # a process whose agents did not all answer has left already
                pass

    say("go")
    parts = [json.loads(k.stdout.readline()) for k in kids if k.stdout is not None]
    got = sum(len(p["done"]) for p in parts)
    row: dict[str, Any] = {"handler": kind, "agents": n, "procs": procs, "answered": got, "poll_s": poll_s}
    if got == n:
        row["rendezvous_s"] = max(max(p["done"]) for p in parts) - max(max(p["joined"]) for p in parts)
    join = Stats()
    for p in parts:
        for k, v in p["join"].items():
            setattr(join, k, getattr(join, k) + v if k != "state_bytes" else max(getattr(join, k), v))
    row |= {f"join_{k}": v for k, v in asdict(join).items()}
    row["join_pickle_s"] = sum(p["pickle_s"] for p in parts)
    row["join_agent_cpu_s"] = sum(p["agent_cpu_s"] for p in parts)
    row["join_proc_cpu_s"] = sum(p["proc_cpu_s"] for p in parts)
    row["join_wall_s"] = max(p["proc_wall_s"] for p in parts)
    row["rss_mb_max_proc"] = max(p["rss_kb"] for p in parts) / 1024
    row["rss_mb_per_agent"] = sum(p["rss_kb"] - p["base_kb"] for p in parts) / 1024 / n  # beyond the imports
    if got == n and quiet_s > 0:
        say("quiet")
        qs = [json.loads(k.stdout.readline()) for k in kids if k.stdout is not None]
        q = Stats()
        for p in qs:
            for k, v in p["quiet"].items():
                setattr(q, k, getattr(q, k) + v if k != "state_bytes" else max(getattr(q, k), v))
        row |= {f"ka_{k}_per_s": v / quiet_s for k, v in asdict(q).items() if k != "state_bytes"}
        row["ka_pickle_s_per_s"] = sum(p["quiet_pickle_s"] for p in qs) / quiet_s
        row["ka_cpu_s_per_s"] = sum(p["quiet_cpu_s"] for p in qs) / quiet_s
    say("exit")
    for k in reversed(kids):
        try:
            k.wait(timeout=30)
        except subprocess.TimeoutExpired:
            k.kill()
    return row


def cycle(n: int, reps: int = 20) -> dict[str, float]:
    """One keep-alive's read-modify-write of a state of ``n`` participants, uncontended, on a
    loopback TCPStore: get, open, unpickle, beat, pickle, seal, compare-and-set (torch's own
    bookkeeping around it not included; ``record_ms``: one of its event records, as each step of its
    loop makes). The least time a write on the one key can take: the ceiling of the writes per
    second the whole group can make."""
    from datetime import datetime, timezone  # deferred: only this measurement

    # deferred: only this measurement (torch's private state classes, read-only use)
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    state = dr._RendezvousState()
    now = datetime.now(timezone.utc)
    for i in range(n):
        node = dr._NodeDesc(f"host-{i:05d}.cluster.example", 1000 + i, 0)
        state.participants[node] = i
        state.last_heartbeats[node] = now
    state.complete = True
    store = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    backend = SealedBackend(C10dRendezvousBackend(store, RUN), KEY.signer(RUN), Refusals())
    backend.set_state(pickle.dumps(state))
    me = next(iter(state.participants))
    t0 = time.perf_counter()
    for _ in range(reps):
        got = backend.get_state()
        assert got is not None
        mine = pickle.loads(got[0])
        mine.last_heartbeats[me] = datetime.now(timezone.utc)
        answer = backend.set_state(pickle.dumps(mine), got[1])
        assert answer is not None and answer[2]
    per = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        dr.get_method_name()
    record = 2 * (time.perf_counter() - t0) / reps  # a record looks the stack up twice
    return {"agents": n, "state_bytes": len(store.get("torch.rendezvous." + RUN)) * 3 // 4,
            "cycle_ms": per * 1000, "record_ms": record * 1000}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--quiet-s", type=float, default=10.0)
    ap.add_argument("--handler", choices=sorted(BACKENDS), default="torch", help="whose rendezvous handler")
    ap.add_argument("--poll-s", type=float, default=0.0, help="quiet phase: num_nodes_waiting every S s")
    ap.add_argument("--deadline-s", type=float, default=600.0, help="give up on the round after this")
    ap.add_argument("--cycle", default="", help="only time one keep-alive write at these sizes (1000,4000)")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        first, count, n, port, quiet, deadline, kind, poll = args.child.split(",")
        child(int(first), int(count), int(n), int(port), float(quiet), float(deadline), kind, float(poll))
    rows = [cycle(int(n)) for n in args.cycle.split(",")] if args.cycle else []
    rows = rows or [run(args.agents, args.procs, args.quiet_s, args.deadline_s, args.handler, args.poll_s)]
    for row in rows:
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
