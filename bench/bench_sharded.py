"""Sharded save/restore through the SDK's path against DCP's own async_save/load, same state, same run.

    python bench/bench_sharded.py --ranks 4 --gb 1.0          # FSDP2 state (model + AdamW moments)

Each rank builds an FSDP2 (``fully_shard``) MLP whose model + optimizer state totals ``--gb`` over
all ranks, takes one AdamW step, then alternates for ``--rounds`` rounds:

* stalwart: ``train.state.capture`` + ``CheckpointEngine.save`` (stall = the staging copy), wait for
  the persist, then ``load_targets`` + ``load_latest`` + ``apply`` (restore);
* dcp: ``dcp.async_save`` of ``get_state_dict`` (stall = until it returns), wait, then ``dcp.load``
  + ``set_state_dict`` (restore).

Per rank it records stall, persist and restore seconds and the peak resident memory above the
rank's level before the phase (sampled every 5 ms from /proc/self/statm), and checks that no rank's
peak comes near the whole state. Rank 0 prints medians over ranks and rounds with the ratio
stalwart/dcp.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class PeakRss:
    """Peak resident bytes above the level at entry, sampled in a thread."""

    def __enter__(self) -> PeakRss:
        self.base = rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=1.0)
        self.peak = max(self.peak, rss())

    @property
    def above(self) -> int:
        return self.peak - self.base


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from stalwart.checkpoint.engine import CheckpointEngine
    from stalwart.checkpoint.tiers import TierConfig
    from stalwart.train import state as state_io

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    # model + 2 AdamW moments = 3 x params (fp32): layers x d x d x 4 B x 3 = gb
    d = args.width
    layers = max(1, round(args.gb * 1e9 / (3 * 4 * d * d)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, d)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    state = {"model": model, "optimizer": opt}
    total = 3 * layers * d * d * 4
    root = Path(args.dir)
    eng = CheckpointEngine(
        [TierConfig(name="local", kind="local", location=str(root / "stalwart"), keep=1, fsync=False)],
        rank=rank,
        world_size=world,
        on_busy="wait",
    )
    rows = []
    for rnd in range(args.rounds):
        dist.barrier()
        with PeakRss() as m_save:
            t0 = time.perf_counter()
            cap = state_io.capture(state)
            ticket = eng.save(rnd, cap.sharded, cap.extras, force=True)
            stall = time.perf_counter() - t0
            t1 = time.perf_counter()
            eng.wait()
            persist = time.perf_counter() - t1
        dist.barrier()
        with PeakRss() as m_load:
            t0 = time.perf_counter()
            targets = state_io.load_targets(state)
            got = eng.load_latest(targets.tensors)
            state_io.apply(state, targets, got.rank_state or {}, own_rng=True)
            restore = time.perf_counter() - t0
        rows.append(
            {
                "impl": "stalwart",
                "stall_s": stall,
                "engine_stall_s": ticket.stall_s,
                "persist_s": persist,
                "restore_s": restore,
                "save_peak_b": m_save.above,
                "load_peak_b": m_load.above,
            }
        )
        dist.barrier()
        where = root / f"dcp-{rnd}"
        with PeakRss() as m_save:
            t0 = time.perf_counter()
            msd, osd = get_state_dict(model, opt)
            fut = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(where))
            stall = time.perf_counter() - t0
            t1 = time.perf_counter()
            fut.result()
            persist = time.perf_counter() - t1
        dist.barrier()
        with PeakRss() as m_load:
            t0 = time.perf_counter()
            msd, osd = get_state_dict(model, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=str(where))
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            restore = time.perf_counter() - t0
        rows.append(
            {
                "impl": "dcp",
                "stall_s": stall,
                "persist_s": persist,
                "restore_s": restore,
                "save_peak_b": m_save.above,
                "load_peak_b": m_load.above,
            }
        )
        dist.barrier()
        if rank == 0:
            shutil.rmtree(where, ignore_errors=True)
    eng.close()
    everything: list = [None] * world
    dist.all_gather_object(everything, rows)
    if rank == 0:
        out = {
            "ranks": world,
            "state_bytes": total,
            "layers": layers,
            "width": d,
            "rounds": args.rounds,
            "per_rank": everything,
        }
        Path(args.json).write_text(json.dumps(out, indent=1))
    dist.destroy_process_group()


def report(path: str) -> None:
    data = json.loads(Path(path).read_text())
    gb = data["state_bytes"] / 1e9
    print(
        f"FSDP2 state {gb:.2f} GB over {data['ranks']} ranks ({gb / data['ranks']:.2f} GB per rank), "
        f"{data['rounds']} round(s); medians over ranks"
    )
    print(
        f"  {'':10s} {'round':>5s} {'stall s':>9s} {'persist s':>10s} {'restore s':>10s} {'save peak GB':>13s} "
        f"{'load peak GB':>13s}"
    )
    stats: dict = {}
    for rnd in range(data["rounds"]):
        for impl in ("stalwart", "dcp"):
            rows = [ranks[2 * rnd + (impl == "dcp")] for ranks in data["per_rank"]]
            s = {k: median(r[k] for r in rows) for k in ("stall_s", "persist_s", "restore_s")}
            s["save_peak_gb"] = max(r["save_peak_b"] for r in rows) / 1e9
            s["load_peak_gb"] = max(r["load_peak_b"] for r in rows) / 1e9
            stats[impl, rnd] = s
            print(
                f"  {impl:10s} {rnd + 1:5d} {s['stall_s']:9.3f} {s['persist_s']:10.3f} {s['restore_s']:10.3f} "
                f"{s['save_peak_gb']:13.3f} {s['load_peak_gb']:13.3f}"
            )
    last = data["rounds"] - 1
    a, b = stats["stalwart", last], stats["dcp", last]
    print(
        f"  round {last + 1} ratio stalwart/dcp: stall {a['stall_s'] / b['stall_s']:.2f}x, persist "
        f"{a['persist_s'] / b['persist_s']:.2f}x, restore {a['restore_s'] / b['restore_s']:.2f}x "
        "(round 1 includes the one-time staging buffer allocation)"
    )
    worst = max(
        max(v["save_peak_gb"], v["load_peak_gb"]) for (impl, _), v in stats.items() if impl == "stalwart"
    )
    print(
        f"  largest per-rank peak above baseline (stalwart): {worst:.3f} GB = {worst / gb:.0%} of the whole "
        "state"
        + (
            " (no rank held the whole model)"
            if worst < gb
            else " (peak reached the size of the whole state: check)"
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--gb", type=float, default=1.0, help="model + optimizer state over all ranks")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="", help="where checkpoints go (default: a temp dir)")
    ap.add_argument("--json", default="", help="keep the raw per-rank figures here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    tmp = tempfile.mkdtemp(prefix="bench-sharded-")
    args.dir = args.dir or tmp
    args.json = args.json or str(Path(tmp) / "result.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.ranks):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(args.ranks),
            LOCAL_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--gb",
            str(args.gb),
            "--width",
            str(args.width),
            "--rounds",
            str(args.rounds),
            "--dir",
            args.dir,
            "--json",
            args.json,
        ]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait(timeout=3600) for p in procs]
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")
    report(args.json)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
