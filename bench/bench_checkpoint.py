"""Checkpoint benchmark: training-loop stall, persist throughput per tier, restore time, host memory.

Same state, same run, one process:
  * stall per checkpoint of the engine vs ``torch.save`` (to local disk, fsync'd) and vs DCP
    ``async_save`` (THREAD, best options that work: reusable pinned/shared ``DefaultStager`` when
    it runs, else the default stager with ``cache_staged_state_dict``), and vs the physical floor:
    a copy of the state into preallocated (pinned on GPU) host buffers;
  * persist throughput of each tier vs raw fsync'd write bandwidth of the same storage;
  * restore time (verify + load) per tier vs ``torch.load``;
  * peak host memory during engine saves beside the state size.

    python bench/bench_checkpoint.py                 # CPU: 320 MB fp32 state
    python bench/bench_checkpoint.py --mb 3200       # GPU: bf16 state on cuda, pinned staging
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from stalwart.checkpoint.engine import CheckpointEngine
from stalwart.checkpoint.tiers import TierConfig

warnings.filterwarnings("ignore")


def make_state(mb: int, device: str) -> dict:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n_tensors = 32
    per = mb * (1 << 20) // n_tensors // torch.finfo(dtype).bits * 8
    g = torch.Generator().manual_seed(0)
    return {
        "model": {f"layer{i}": torch.randn(per, generator=g).to(dtype).to(device) for i in range(n_tensors)},
        "step": 1,
    }


def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state["model"].values())


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def rss_bytes() -> tuple[int, int]:
    cur = peak = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            cur = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return cur, peak


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def raw_write_GBps(directory: Path, size: int) -> float:
    """Write ``size`` bytes in 16 MiB chunks and fsync: the storage's own bandwidth."""
    directory.mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(16 << 20)
    path = directory / "raw.bin"
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    path.unlink()
    return size / dt / 1e9


class Floor:
    """The physical floor of a stall: copy the state into preallocated (pinned on GPU) host buffers."""

    def __init__(self, state: dict) -> None:
        pin = torch.cuda.is_available()
        self.state = state
        self.bufs = {
            k: torch.empty(v.shape, dtype=v.dtype, pin_memory=pin) for k, v in state["model"].items()
        }
        for b in self.bufs.values():
            b.zero_()

    def __call__(self) -> float:
        def copy():
            for k, v in self.state["model"].items():
                self.bufs[k].copy_(v, non_blocking=True)

        return timed(copy)


class TorchSave:
    """torch.save to local disk with fsync: blocking, so all of it is stall."""

    def __init__(self, state: dict, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        self.state, self.path = state, d / "state.pt"

    def __call__(self) -> float:
        def save():
            with open(self.path, "wb") as fh:
                torch.save(self.state, fh)
                fh.flush()
                os.fsync(fh.fileno())

        return timed(save)

    def load_s(self) -> float:
        return timed(lambda: torch.load(self.path, weights_only=False))


class DcpAsync:
    """DCP async_save (THREAD) with the best options that run here; the first that works is kept.

    Stall = until the call returned and, with async staging, until staging completed (the state
    may not be modified before that); the call-return time and the total are kept as well."""

    def __init__(self, state: dict, d: Path) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = torch.cuda.is_available()
        self.state, self.dir, self.n = state, d, 0
        self.returns: list[float] = []
        self.totals: list[float] = []
        self.stager = None
        variants = [
            (
                f"DefaultStager(pinned={cuda}, shm={not cuda}, async staging, non-blocking={cuda})",
                lambda: DefaultStager(
                    StagingOptions(
                        use_pinned_memory=cuda,
                        use_shared_memory=not cuda,
                        use_async_staging=True,
                        use_non_blocking_copy=cuda,
                    )
                ),
                False,
            ),
            ("default stager, cache_staged_state_dict=True", lambda: None, True),
            ("default stager", lambda: None, False),
        ]
        self.label = "none worked"
        for label, make, cache in variants:
            try:
                self.stager, self.cache = make(), cache
                self._save()  # warm-up: allocates the stager's buffers
                self.label = label
                break
            except Exception as exc:  # noqa: BLE001 - report and fall back to the next variant
                print(f"  DCP async_save with {label} failed: {type(exc).__name__}: {exc}")
        self.returns.clear()
        self.totals.clear()

    def _save(self) -> float:
        self.n += 1
        path = self.dir / f"dcp-{self.n}"
        writer = dcp.FileSystemWriter(path, sync_files=True, cache_staged_state_dict=self.cache)
        sync()
        t0 = time.perf_counter()
        resp = (
            dcp.async_save(self.state, storage_writer=writer, async_stager=self.stager)
            if self.stager
            else dcp.async_save(self.state, storage_writer=writer)
        )
        returned = time.perf_counter() - t0
        fut = resp
        if hasattr(resp, "staging_completion"):
            resp.staging_completion.result()
            fut = resp.upload_completion
        stall = time.perf_counter() - t0
        fut.result()
        self.totals.append(time.perf_counter() - t0)
        self.returns.append(returned)
        shutil.rmtree(path, ignore_errors=True)
        return stall

    def __call__(self) -> float:
        return self._save() if self.label != "none worked" else float("nan")

    def close(self) -> None:
        if self.stager is not None:
            self.stager.close()


def bench_engine(state: dict, tiers: list[TierConfig], reps: int, floor: Floor) -> dict:
    """Saves interleaved with floor copies, so both see the same machine load (it is shared)."""
    eng = CheckpointEngine(tiers)
    size = nbytes(state)
    reset_peak()
    base_rss = rss_bytes()[0]
    peak = [base_rss]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.005):
            peak[0] = max(peak[0], rss_bytes()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stalls, floors, persist = [], [], {t.name: [] for t in tiers}
    for i in range(reps + 1):
        floors.append(floor())
        ticket = eng.save(i + 1, state, force=True)
        res = ticket.future.result()
        assert len(res.committed) == len(tiers), res
        if i > 0:  # the first save allocates the staging buffers
            stalls.append(ticket.stall_s)
            for c in res.commits:
                persist[c.tier].append(c.persist_s)
        state["model"]["layer0"].add_(1)
    stop.set()
    sampler.join()
    peak_rss = max(peak[0], rss_bytes()[1])
    restore = {}
    for t in tiers:
        others = [x for x in tiers if x.name != t.name]
        hidden = [Path(x.location) for x in others]
        moved = [p.rename(p.with_name(p.name + ".hidden")) for p in hidden]  # load from this tier only
        target = {"model": {k: torch.empty_like(v) for k, v in state["model"].items()}, "step": 0}
        t0 = time.perf_counter()
        got = eng.load_latest(target)
        sync()
        restore[t.name] = time.perf_counter() - t0
        assert got is not None and got.tier == t.name
        for p in moved:
            p.rename(p.with_name(p.name[: -len(".hidden")]))
    eng.close()
    mem_tier = [t for t in tiers if t.kind == "memory"]
    return {
        "stall_s": statistics.median(stalls),
        "stalls_s": stalls,
        "floor_s": statistics.median(floors[1:]),
        "floors_s": floors[1:],
        "persist_s": {k: statistics.median(v) for k, v in persist.items()},
        "persist_GBps": {k: size / statistics.median(v) / 1e9 for k, v in persist.items()},
        "restore_s": restore,
        "rss_before_save": base_rss,
        "peak_rss_during_saves": peak_rss,
        "staging_bytes": eng.stager.allocated_bytes,
        "memory_tier_bytes_per_version": (dir_bytes(Path(mem_tier[0].location)) // max(1, mem_tier[0].keep))
        if mem_tier
        else 0,
    }


def python_bound_step() -> float:
    """A stand-in for a GPU training step's host side: many small tensor ops (GIL-bound launches)."""
    x = torch.ones(64, 64)
    t0 = time.perf_counter()
    for _ in range(300):
        x = (x * 1.0001).add_(0.0001)
    return time.perf_counter() - t0


def bench_interference(state: dict, tiers: list[TierConfig]) -> dict:
    """Host-side step time with no checkpoint in flight vs while the engine persists in background."""
    eng = CheckpointEngine(tiers)
    eng.save(0, state, force=True).future.result()
    idle = [python_bound_step() for _ in range(40)]
    busy: list[float] = []
    for i in range(3):
        ticket = eng.save(i + 1, state, force=True)
        while not ticket.future.done():
            busy.append(python_bound_step())
    eng.close()
    return {
        "idle_step_s": statistics.median(idle),
        "during_persist_step_s": statistics.median(busy),
        "steps_during_persist": len(busy),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=None, help="state size in MiB (default 320 CPU, 3200 GPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--disk-dir", default=None, help="local disk directory (default: a temp dir)")
    ap.add_argument("--shm-dir", default="/dev/shm")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mb = args.mb or (3200 if device == "cuda" else 320)
    state = make_state(mb, device)
    size = nbytes(state)
    disk = Path(tempfile.mkdtemp(prefix="stalwart-bench-", dir=args.disk_dir))
    shm = Path(tempfile.mkdtemp(prefix="stalwart-bench-", dir=args.shm_dir))
    print(f"state: {size / 1e6:.0f} MB on {device} ({torch.__version__}); {os.cpu_count()} CPUs")
    try:
        out: dict = {
            "device": device,
            "torch": torch.__version__,
            "state_bytes": size,
            "cpus": os.cpu_count(),
        }
        out["raw_write_GBps"] = {
            "memory": raw_write_GBps(shm / "raw", size),
            "local": raw_write_GBps(disk / "raw", size),
        }
        tiers = [
            TierConfig(name="memory", kind="memory", location=str(shm / "tier"), keep=1),
            TierConfig(name="local", kind="local", location=str(disk / "tier"), keep=1),
        ]
        floor = Floor(state)
        out["engine"] = bench_engine(state, tiers, args.reps, floor)
        # stall: one round = floor copy, engine save, torch.save, DCP async_save, so that every method
        # sees the same load on this shared machine; medians over the rounds
        eng = CheckpointEngine(tiers)
        eng.save(0, state, force=True).future.result()  # allocates the staging buffers
        tsave, dasync = TorchSave(state, disk / "ts"), DcpAsync(state, disk / "dcp")
        rounds: dict[str, list[float]] = {"floor": [], "engine": [], "torch_save": [], "dcp_async": []}
        for i in range(args.reps):
            rounds["floor"].append(floor())
            ticket = eng.save(i + 1, state, force=True)
            rounds["engine"].append(ticket.stall_s)
            ticket.future.result()
            rounds["torch_save"].append(tsave())
            rounds["dcp_async"].append(dasync())
        eng.close()
        dasync.close()
        out["rounds"] = rounds
        med = {k: statistics.median(v) for k, v in rounds.items()}
        out["floor_copy_s"], out["engine_stall_s"] = med["floor"], med["engine"]
        out["torch_save_s"], out["dcp_async_stall_s"] = med["torch_save"], med["dcp_async"]
        out["torch_load_s"] = tsave.load_s()
        out["dcp_async_call_s"] = statistics.median(dasync.returns) if dasync.returns else float("nan")
        out["dcp_async_total_s"] = statistics.median(dasync.totals) if dasync.totals else float("nan")
        out["dcp_async_variant"] = dasync.label
        out["interference"] = bench_interference(state, tiers)
    finally:
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    e = out["engine"]
    s = out["engine_stall_s"]
    print(f"stall per checkpoint (median of {args.reps} interleaved rounds, after a warm-up):")
    print(
        f"  floor: copy into preallocated {'pinned ' if device == 'cuda' else ''}host buffers  {out['floor_copy_s']:.4f} s"
    )
    print(
        f"  stalwart engine                                        {s:.4f} s  = {s / out['floor_copy_s']:.2f}x floor"
    )
    print(
        f"  torch.save (fsync'd, blocking)                         {out['torch_save_s']:.4f} s  "
        f"= {out['torch_save_s'] / s:.1f}x engine"
    )
    print(f"  DCP async_save [{out['dcp_async_variant']}]")
    print(
        f"                                                         {out['dcp_async_stall_s']:.4f} s  "
        f"= {out['dcp_async_stall_s'] / s:.1f}x engine (call returned after {out['dcp_async_call_s']:.4f} s; "
        f"persist done after {out['dcp_async_total_s']:.2f} s)"
    )
    print("persist per tier (background) vs raw fsync'd write of the same bytes:")
    for t in ("memory", "local"):
        print(
            f"  {t:7s} {e['persist_s'][t]:.3f} s = {e['persist_GBps'][t]:.2f} GB/s vs raw {out['raw_write_GBps'][t]:.2f} GB/s "
            f"({e['persist_GBps'][t] / out['raw_write_GBps'][t]:.2f}x)"
        )
    i = out["interference"]
    print(
        f"host-side step (300 small ops) while persisting: {i['during_persist_step_s'] * 1e3:.2f} ms vs "
        f"{i['idle_step_s'] * 1e3:.2f} ms idle = {i['during_persist_step_s'] / i['idle_step_s']:.2f}x "
        f"({i['steps_during_persist']} steps measured during persists)"
    )
    print("restore (verify checksums + load):")
    for t in ("memory", "local"):
        print(
            f"  {t:7s} {e['restore_s'][t]:.3f} s   (torch.load of the torch.save file: {out['torch_load_s']:.3f} s)"
        )
    print(
        f"host memory: state {size / 1e6:.0f} MB; staging buffers {e['staging_bytes'] / 1e6:.0f} MB (reused); "
        f"RSS before saves {e['rss_before_save'] / 1e6:.0f} MB, peak during saves "
        f"{e['peak_rss_during_saves'] / 1e6:.0f} MB (+{(e['peak_rss_during_saves'] - e['rss_before_save']) / 1e6:.0f} MB); "
        f"memory tier {e['memory_tier_bytes_per_version'] / 1e6:.0f} MB per version in tmpfs"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
