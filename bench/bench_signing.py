"""The cost of signing the control plane (job_key.py) on the recovery path: the tree before the job key
against the tree after it, interleaved in one run.

Every record the agents exchange through a store is sealed with HMAC-SHA256 (job_key.Signer): torch's
pickled rendezvous state (launch/sealed_rendezvous.SealedBackend), the names, master and worker-store
records (job_key.SealedStore), and every in-place board record (launch/reform_board.StoreBoard).

1. ``micro``: Signer.seal and Signer.open in this process, µs per call, for 100 B, 1 KiB and 100 KiB
   payloads, and the size of torch's pickled rendezvous state at 8 and 64 nodes (what one seal covers).
2. ``count`` (``--count``): how many seals and opens the agents of one run make, counted by wrapping
   Signer.seal/open in every process of an extra run of the signed tree (a ``sitecustomize`` on its
   PYTHONPATH; those runs are not timed), split at the fault: before it is start-up (the rendezvous),
   after it the recovery.
3. A/B end to end, interleaved (old, new, old, new, ... ``--repeats`` each, so that whatever else runs
   on the machine falls on both): the existing benches' measurement functions, with the ``stalwart
   run`` agents they start (and the rendezvous agents) importing Stalwart from one tree or the other
   through PYTHONPATH. Both get STALWART_JOB_KEY_FILE (a 0600 file of 64 hex characters; the old tree
   never reads it):

   * ``inplace``: bench_inplace.run_stalwart, one node, N ranks, rank 1 SIGKILLed and replaced in place.
     One node has no store between agents: nothing is signed on this path (the count shows it);
   * ``nodes``: bench_inplace_nodes.run, N agents x 1 rank on loopback, rank 1 replaced in place across
     nodes (the board carries the announcement, the waits);
   * ``grow``: bench_grow.run, N agents, n1's agent killed with its rank, the group shrinks in place,
     n1 comes back and the group grows in place (board: offer, invite, ready, announcement);
   * ``rdzv``: bench_rdzv._run, c10d rendezvous rounds between N network-namespace hosts (root), each
     agent's handler made by make_handler, sealed on the new tree (bench/rdzv_agent.py).

Reported per size: the median of each tree, the ratio of medians new/old, and the spread (each
tree's min-max, and the range of the ratio over the pairs run back to back).

Run: .venv/bin/python bench/bench_signing.py --old /work/wt-old [--repeats 3] [--parts micro,inplace,nodes,grow,rdzv]
     [--inplace-ranks 2,8] [--nodes 2,4] [--grow-nodes 3] [--rdzv-sizes 2,8] [--count] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import timeit
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT)]

import bench_grow  # noqa: E402
import bench_inplace  # noqa: E402
import bench_inplace_nodes  # noqa: E402

from stalwart.events import ChaosInjected  # noqa: E402
from stalwart.job_key import KEY_FILE_ENV, JobKey, KeySource  # noqa: E402
from stalwart.ledger import read_merged  # noqa: E402

# Installed through PYTHONPATH in every process of a counting run: Signer.seal/open record (time,
# call, context kind, payload bytes) and each process writes its own calls at exit (the agent leaves
# through os._exit: that writes them too). A forked child inherits its parent's list; only the calls
# its own pid made are written.
COUNTER = """
import atexit, json, os, time
_calls = []
def _install():
    try:
        from stalwart import job_key
    except ImportError:
        return
    seal, open_ = job_key.Signer.seal, job_key.Signer.open
    def _seal(self, context, payload):
        _calls.append((os.getpid(), time.time(), "seal", context.split("|")[0], len(payload)))
        return seal(self, context, payload)
    def _open(self, context, sealed):
        _calls.append((os.getpid(), time.time(), "open", context.split("|")[0], len(sealed)))
        return open_(self, context, sealed)
    job_key.Signer.seal, job_key.Signer.open = _seal, _open
    def _dump():
        mine = [c[1:] for c in _calls if c[0] == os.getpid()]
        if mine:
            with open(os.path.join(os.environ["BENCH_SEAL_DIR"], f"{os.getpid()}.json"), "w") as fh:
                json.dump(mine, fh)
    atexit.register(_dump)
    real_exit = os._exit
    def _exit(code):
        _dump()
        real_exit(code)
    os._exit = _exit
if os.environ.get("BENCH_SEAL_DIR"):
    _install()
"""


# -- micro ------------------------------------------------------------------------------------------


def micro(sizes=(100, 1024, 100 * 1024), number: int = 2000) -> list[dict]:
    """µs per Signer.seal and Signer.open (best of 5 batches) for each payload size."""
    signer = JobKey(secrets.token_bytes(32), KeySource.RUN).signer("bench-signing")
    context = "rendezvous-state"
    rows = []
    for size in sizes:
        payload = os.urandom(size)
        sealed = signer.seal(context, payload)
        n = max(50, number * 1024 // max(size, 1024))
        seal = min(timeit.repeat(lambda p=payload: signer.seal(context, p), number=n, repeat=5)) / n
        opened = min(timeit.repeat(lambda x=sealed: signer.open(context, x), number=n, repeat=5)) / n
        rows.append({"bytes": size, "seal_us": seal * 1e6, "open_us": opened * 1e6})
    return rows


def state_bytes(nodes: int) -> int:
    """The size of torch's pickled rendezvous state with ``nodes`` participants (what SealedBackend seals)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    state = _RendezvousState()
    state.round, state.complete = 3, True
    state.deadline = datetime.now(timezone.utc)
    for i in range(nodes):
        node = _NodeDesc(f"node-{i:04d}.cluster.example.org", 100000 + i, 0)
        state.participants[node] = i
        state.last_heartbeats[node] = datetime.now(timezone.utc)
    return len(pickle.dumps(state))


# -- the trees and the A/B loop ---------------------------------------------------------------------


def key_file(where: Path) -> Path:
    path = where / "job.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w") as fh:
        fh.write(secrets.token_hex(32) + "\n")
    return path


def use(src: Path, counter: Path | None = None) -> None:
    """The benches' subprocesses (``python -m stalwart.cli run``) import Stalwart from ``src``."""
    os.environ["PYTHONPATH"] = f"{counter}:{src}" if counter else str(src)
    os.environ.pop("BENCH_SEAL_DIR", None)


def ab(
    what: str,
    size: int,
    arm: Callable[[Path], dict],
    metrics: list[str],
    trees: dict[str, Path],
    repeats: int,
) -> dict:
    """``arm(work dir)`` on each tree in turn, ``repeats`` times each, interleaved; the rows per tree."""
    rows: dict[str, list[dict]] = {label: [] for label in trees}
    failed: dict[str, int] = dict.fromkeys(trees, 0)
    for i in range(repeats):
        for label, src in trees.items():
            use(src)
            work = Path(tempfile.mkdtemp(prefix=f"bench-signing-{what}-{size}-"))
            t0 = time.time()
            try:
                row = arm(work)
            except Exception as exc:  # noqa: BLE001 - a run that fails on a loaded machine is counted, not fatal
                failed[label] += 1
                print(f"{what} {size}, round {i + 1}, {label}: FAILED ({str(exc)[-300:]})", flush=True)
                continue
            finally:
                shutil.rmtree(work, ignore_errors=True)
            rows[label].append(row)
            shown = ", ".join(f"{m} {row[m]:.3f}s" for m in metrics)
            print(
                f"{what} {size}, round {i + 1}, {label}: {shown} ({time.time() - t0:.0f}s, "
                f"load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    return {"rows": rows, "failed": failed}


def summary(res: dict, metric: str) -> dict | None:
    """Medians, ratio of medians new/old, each tree's min-max and the range of the pairwise ratios."""
    old = [r[metric] for r in res["rows"]["old"]]
    new = [r[metric] for r in res["rows"]["new"]]
    if not old or not new:
        return None
    pairs = [n / o for o, n in zip(old, new, strict=False) if o > 0]
    mo, mn = statistics.median(old), statistics.median(new)
    return {
        "old": mo,
        "new": mn,
        "ratio": mn / mo,
        "old_range": (min(old), max(old)),
        "new_range": (min(new), max(new)),
        "pair_ratios": (min(pairs), max(pairs)) if pairs else (float("nan"), float("nan")),
        "n": (len(old), len(new)),
    }


# -- the arms ---------------------------------------------------------------------------------------


def inplace_arm(ranks: int) -> Callable[[Path], dict]:
    def arm(work: Path) -> dict:
        row = bench_inplace.run_stalwart(work, ranks, True)
        if "in_place_phases" not in row:
            raise RuntimeError(f"did not recover in place ({row['path']})")
        row["reform_s"] = sum(v for k, v in row["in_place_phases"].items() if k != "detect")
        return row

    return arm


def nodes_arm(nodes: int) -> Callable[[Path], dict]:
    def arm(work: Path) -> dict:
        row = bench_inplace_nodes.run(work, nodes, 1, True)
        row["reform_s"] = sum(v for k, v in row["phases"].items() if k != "detect")
        return row

    return arm


def grow_arm(nodes: int, last_call: float) -> Callable[[Path], dict]:
    return lambda work: bench_grow.run(work, nodes, 1, True, last_call)


def rdzv_ab(sizes: list[int], rounds: int, trees: dict[str, Path], repeats: int) -> dict:
    """c10d rendezvous rounds among N namespace hosts, old and new interleaved on the same hosts."""
    from bench_rdzv import _run

    import hosts

    out: dict = {}
    port = 29400
    for n in sizes:
        rows: dict[str, list[dict]] = {label: [] for label in trees}
        failed = dict.fromkeys(trees, 0)
        root = Path(tempfile.mkdtemp(prefix=f"bench-signing-rdzv-{n}-"))
        try:
            with hosts.Hosts([f"h{i}" for i in range(n)]) as h:
                for i in range(repeats):
                    for label, src in trees.items():
                        use(src)
                        port += 1  # a fresh port every run: no socket of the last run's store in the way
                        try:
                            t = _run(
                                h, "c10d", f"{h.addr('h0')}:{port}", n, rounds, root / f"{label}-{i}", src
                            )
                        except (SystemExit, Exception) as exc:  # noqa: BLE001 - counted, not fatal
                            failed[label] += 1
                            print(f"rdzv {n}, round {i + 1}, {label}: FAILED ({str(exc)[-300:]})", flush=True)
                            continue
                        row = {"first_s": t[0], "reform_s": statistics.median(t[1:]), "rounds": t}
                        rows[label].append(row)
                        print(
                            f"rdzv {n}, round {i + 1}, {label}: first {t[0]:.3f}s, re-form median "
                            f"{row['reform_s']:.3f}s over {len(t) - 1} (load {os.getloadavg()[0]:.1f})",
                            flush=True,
                        )
        finally:
            shutil.rmtree(root, ignore_errors=True)
        out[n] = {"rows": rows, "failed": failed}
    return out


# -- counting ---------------------------------------------------------------------------------------


def _kind(context: str) -> str:
    return re.sub(r"/(n?\d+|h\d+)$", "/*", context)


def counted(what: str, size: int, run: Callable[[Path], None], src: Path, rounds: int = 0) -> dict:
    """One run of the signed tree with every Signer call recorded; calls before and after the fault
    (``rounds``: per rendezvous round instead)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-signing-count-{what}-"))
    try:
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(COUNTER)
        (tmp / "calls").mkdir()
        use(src, tmp / "site")
        os.environ["BENCH_SEAL_DIR"] = str(tmp / "calls")
        fault = run(tmp / "work")
        use(src)
        calls = [c for f in (tmp / "calls").glob("*.json") for c in json.loads(f.read_text())]
    finally:
        os.environ.pop("BENCH_SEAL_DIR", None)
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict = {"what": what, "size": size, "calls": len(calls)}
    if rounds:
        out["per_round"] = {
            f"{k[0]} {k[1]}": v / rounds for k, v in Counter((c[1], c[2]) for c in calls).items()
        }
        out["bytes_max"] = max((c[3] for c in calls), default=0)
        return out
    for phase, sel in (("start-up", lambda t: t < fault), ("recovery", lambda t: t >= fault)):
        picked = [c for c in calls if sel(c[0])]
        out[phase] = {
            f"{k[0]} {_kind(k[1])}": v for k, v in sorted(Counter((c[1], c[2]) for c in picked).items())
        }
        out[phase + " seals"] = sum(1 for c in picked if c[1] == "seal")
        out[phase + " opens"] = sum(1 for c in picked if c[1] == "open")
    return out


def _fault_of(work: Path) -> float:
    evs = read_merged(work)
    return min(e.ts for e in evs if isinstance(e, ChaosInjected))


def count_ledger_run(arm: Callable[[Path], dict], ledger: str) -> Callable[[Path], float]:
    """Run ``arm`` in ``work`` and return the fault's time from its ledger (read before it is removed)."""

    def run(work: Path) -> float:
        work.mkdir()
        arm(work)
        return _fault_of(work / ledger)

    return run


# -- main -------------------------------------------------------------------------------------------


def _table(title: str, entries: list[tuple[str, dict | None, dict]]) -> list[str]:
    lines = [
        title,
        "what | old median | new median | new/old | old min-max | new min-max | pair ratios | runs (old/new, failed)",
    ]
    for name, s, res in entries:
        if s is None:
            lines.append(f"{name} | - | - | - | - | - | - | failed {res['failed']}")
            continue
        lines.append(
            f"{name} | {s['old']:.3f}s | {s['new']:.3f}s | {s['ratio']:.3f} | {s['old_range'][0]:.2f}-"
            f"{s['old_range'][1]:.2f}s | {s['new_range'][0]:.2f}-{s['new_range'][1]:.2f}s | "
            f"{s['pair_ratios'][0]:.2f}-{s['pair_ratios'][1]:.2f} | {s['n'][0]}/{s['n'][1]}, "
            f"{sum(res['failed'].values())}"
        )
    return lines


def _sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _micro(res: dict) -> None:
    rows = micro()
    res["micro"] = rows
    res["state_bytes"] = {n: state_bytes(n) for n in (8, 64)}
    report = ["Signer.seal / Signer.open, µs per call (best of 5 batches, this process)"]
    report += [f"{r['bytes']:>7d} B | seal {r['seal_us']:.2f} µs | open {r['open_us']:.2f} µs" for r in rows]
    report.append(
        "torch's pickled rendezvous state: "
        + ", ".join(f"{n} nodes {b} B" for n, b in res["state_bytes"].items())
    )
    print("\n".join(report), flush=True)


def _counts(args: argparse.Namespace, parts: set[str], trees: dict[str, Path], res: dict) -> None:
    counts = []
    if "inplace" in parts:
        n = _sizes(args.inplace_ranks)[0]
        counts.append(counted("inplace", n, count_ledger_run(inplace_arm(n), "stalwart"), trees["new"]))
    if "nodes" in parts:
        for n in _sizes(args.nodes):
            counts.append(counted("nodes", n, count_ledger_run(nodes_arm(n), "run"), trees["new"]))
    if "grow" in parts:
        for n in _sizes(args.grow_nodes):
            arm = grow_arm(n, args.grow_last_call)
            counts.append(counted("grow", n, count_ledger_run(arm, "run"), trees["new"]))
    if "rdzv" in parts:
        from bench_rdzv import _run

        import hosts

        for n in _sizes(args.rdzv_sizes):

            def one(work: Path, n: int = n) -> float:
                with hosts.Hosts([f"h{i}" for i in range(n)]) as h:
                    _run(h, "c10d", f"{h.addr('h0')}:29399", n, args.rdzv_rounds, work, trees["new"])
                return 0.0

            counts.append(counted("rdzv", n, one, trees["new"], rounds=args.rdzv_rounds))
    res["counts"] = counts
    for c in counts:
        print(json.dumps(c), flush=True)


def _ab_all(args: argparse.Namespace, parts: set[str], trees: dict[str, Path], res: dict) -> None:
    started = time.time()
    ab_entries: list[tuple[str, dict | None, dict]] = []
    for n in _sizes(args.inplace_ranks) if "inplace" in parts else []:
        r = ab("inplace", n, inplace_arm(n), ["first_step_s", "reform_s"], trees, args.repeats)
        res.setdefault("inplace", {})[n] = r
        ab_entries += [(f"one node, {n} ranks: fault -> first step", summary(r, "first_step_s"), r)]
        ab_entries += [
            (f"one node, {n} ranks: re-formation (phases after detect)", summary(r, "reform_s"), r)
        ]
    for n in _sizes(args.nodes) if "nodes" in parts else []:
        r = ab("nodes", n, nodes_arm(n), ["first_step_s", "reform_s"], trees, args.repeats)
        res.setdefault("nodes", {})[n] = r
        ab_entries += [(f"{n} nodes: fault -> first step", summary(r, "first_step_s"), r)]
        ab_entries += [(f"{n} nodes: re-formation (phases after detect)", summary(r, "reform_s"), r)]
    for n in _sizes(args.grow_nodes) if "grow" in parts else []:
        r = ab("grow", n, grow_arm(n, args.grow_last_call), ["pause_s", "return_s"], trees, args.repeats)
        res.setdefault("grow", {})[n] = r
        ab_entries += [(f"grow to {n} nodes: pause", summary(r, "pause_s"), r)]
        ab_entries += [(f"grow to {n} nodes: return -> all stepping", summary(r, "return_s"), r)]
    if "rdzv" in parts:
        rd = rdzv_ab(_sizes(args.rdzv_sizes), args.rdzv_rounds, trees, args.repeats)
        res["rdzv"] = rd
        for n, r in rd.items():
            ab_entries += [(f"rendezvous {n} hosts: first round", summary(r, "first_s"), r)]
            ab_entries += [(f"rendezvous {n} hosts: re-form round (median)", summary(r, "reform_s"), r)]
    if ab_entries:
        table = _table(
            f"\nnew (signed) / old, medians of {args.repeats} interleaved runs each "
            f"(load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, {time.time() - started:.0f}s)",
            ab_entries,
        )
        print("\n".join(table), flush=True)
        res["table"] = [(name, s) for name, s, _ in ab_entries]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, required=True, help="the tree before signing (its root)")
    ap.add_argument("--new", type=Path, default=ROOT, help="the tree after signing (default: this one)")
    ap.add_argument("--parts", default="micro,inplace,nodes,grow,rdzv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inplace-ranks", default="2,8")
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--grow-nodes", default="3")
    ap.add_argument("--grow-last-call", type=float, default=4.0)
    ap.add_argument("--rdzv-sizes", default="2,8")
    ap.add_argument("--rdzv-rounds", type=int, default=6)
    ap.add_argument("--count", action="store_true", help="also count the seals of one run of each size")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    trees = {"old": args.old.resolve() / "src", "new": args.new.resolve() / "src"}
    keydir = Path(tempfile.mkdtemp(prefix="bench-signing-key-"))
    os.environ[KEY_FILE_ENV] = str(key_file(keydir))
    res: dict = {
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg(),
        "repeats": args.repeats,
        "trees": {k: str(v) for k, v in trees.items()},
    }
    try:
        if "micro" in parts:
            _micro(res)
        if args.count:
            _counts(args, parts, trees, res)
        _ab_all(args, parts, trees, res)
    finally:
        shutil.rmtree(keydir, ignore_errors=True)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
