"""Rendezvous round time: one host's c10d store against a 3-member etcd cluster, at 2, 4 and 8 hosts.

Hosts are network namespaces on one bridge (tests/hosts.py); the etcd members run on three hosts of
their own (e0-e2), the agents on h0..h{N-1} (h0 hosts the c10d store). Each agent builds Stalwart's
rendezvous handler (launch/rendezvous.make_handler: torch's dynamic rendezvous on the c10d
TCPStore, or on etcd through launch/rendezvous/etcd.py) with ``--nnodes N``, then goes through
``--rounds`` rounds (bench/rdzv_agent.py). Every round starts at a file barrier; the first forms
the rendezvous, each later one is a re-form (every agent leaves and joins again, as after a group
restart).

What is measured: the rendezvous call itself. A round's time is from the moment the last agent
called ``next_rendezvous`` (all agents joined) to the moment the last agent had its rank and world
size back (max(done) - max(joined)). Not included: starting Python and importing torch, building
the handler, and starting workers.

Needs root. Run: .venv/bin/python bench/bench_rdzv.py [--sizes 2,4,8] [--rounds 6] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from tests.e2e.test_hosts import _etcd_cluster  # noqa: E402

import hosts  # noqa: E402

ETCD = ["e0", "e1", "e2"]


def _run(
    h: hosts.Hosts, backend: str, endpoint: str, n: int, rounds: int, out: Path, src: Path = ROOT / "src"
) -> list[float]:
    """``n`` agents through ``rounds`` rounds, their Stalwart imported from ``src`` (another tree's
    for an A/B, bench/bench_signing.py); each round's time."""
    out.mkdir(parents=True)
    run_id = f"bench-{backend}-{n}-{os.getpid()}-{out.name}"
    env = {**os.environ, "PYTHONPATH": f"{src}:{os.environ.get('PYTHONPATH', '')}"}
    procs = []
    for i in range(n):
        name = f"h{i}"
        argv = [sys.executable, str(ROOT / "bench" / "rdzv_agent.py"), backend, endpoint, run_id]
        argv += [str(n), name, str(out), str(rounds), "1" if i == 0 else "0"]
        procs.append(
            h.popen(name, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    for p in procs:
        text, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"an agent failed ({p.returncode}): {text[-2000:]}")
    per = [json.loads((out / f"h{i}.json").read_text()) for i in range(n)]
    times = []
    for r in range(rounds):
        joined = max(a[r]["joined"] for a in per)
        done = max(a[r]["done"] for a in per)
        worlds = {a[r]["world"] for a in per}
        assert worlds == {n}, f"round {r}: world sizes {worlds}"
        times.append(done - joined)
    return times


def measure(sizes: list[int], rounds: int) -> list[dict]:
    rows = []
    for n in sizes:
        agents = [f"h{i}" for i in range(n)]
        root = Path(tempfile.mkdtemp(prefix=f"acct-rdzv-{n}-"))
        with hosts.Hosts([*ETCD, *agents]) as h:
            endpoints = _etcd_cluster(h, root, ETCD)
            for backend, endpoint in (("c10d", f"{h.addr('h0')}:29400"), ("etcd", endpoints)):
                t = _run(h, backend, endpoint, n, rounds, root / backend)
                rows.append(
                    {
                        "hosts": n,
                        "backend": backend,
                        "first_s": t[0],
                        "reform_median_s": statistics.median(t[1:]),
                        "reform_max_s": max(t[1:]),
                        "rounds": t,
                    }
                )
                print(
                    f"{n} hosts {backend:5s}: first round {t[0]:.3f}s, re-form median "
                    f"{statistics.median(t[1:]):.3f}s (max {max(t[1:]):.3f}s, {len(t) - 1} rounds)",
                    flush=True,
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    why = hosts.why_not()
    if why:
        raise SystemExit(why)
    started = time.time()
    rows = measure([int(x) for x in args.sizes.split(",")], args.rounds)
    load = os.getloadavg()[0]
    print(f"done in {time.time() - started:.0f}s, load average {load:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load": load}, indent=1))


if __name__ == "__main__":
    main()
