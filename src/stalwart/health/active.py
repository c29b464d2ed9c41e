"""Active checks: GEMM throughput, memory bandwidth, all-reduce bus bandwidth, disk write, a training step.

Measuring (``measure_*``, needs torch and time) is separate from judging (``check_active``, pure).
On a machine without CUDA everything runs on CPU against CPU expectations, so the suite is
testable anywhere; on GPUs each device is measured and compared with the node's best device.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .findings import Finding, Severity


@dataclass(frozen=True)
class ActiveExpectations:
    gemm_tflops: float  # per device floor
    gemm_vs_best: float  # each device at least this fraction of the node's best (gpu-fryer: 0.9)
    mem_bw_gbps: float
    allreduce_busbw_gbps: float
    disk_write_gbps: float


# CPU floors are ~10x below what a busy 2-core CI VM measures (docs/benchmarks.md): they catch a
# broken or pathologically slow node, not a 10 % regression.
CPU_EXPECTATIONS = ActiveExpectations(
    gemm_tflops=0.002, gemm_vs_best=0.5, mem_bw_gbps=0.2, allreduce_busbw_gbps=0.005, disk_write_gbps=0.005
)
# From the recorded H100 80GB HBM3 (tests/fixtures/gpu/h100/perf_limits.json: bf16 GEMM 729 TFLOPS,
# device-to-device 2981 GB/s, fsync'd disk write 1.14 GB/s), with ~20 % headroom.
H100_EXPECTATIONS = ActiveExpectations(
    gemm_tflops=580.0, gemm_vs_best=0.9, mem_bw_gbps=2400.0, allreduce_busbw_gbps=100.0, disk_write_gbps=0.5
)


@dataclass(frozen=True)
class ActiveMeasurements:
    device_kind: str  # cpu | cuda
    gemm_tflops: dict[str, float] = field(default_factory=dict)  # per device
    mem_bw_gbps: dict[str, float] = field(default_factory=dict)
    allreduce_busbw_gbps: float | None = None
    allreduce_ranks: int = 0
    disk_write_gbps: float | None = None
    train_step_ok: bool | None = None
    train_step_detail: str = ""
    errors: tuple[str, ...] = ()
    seconds: dict[str, float] = field(default_factory=dict)


def _devices() -> list[str]:
    import torch  # deferred: heavy (torch)

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def _sync(dev: str) -> None:
    if dev.startswith("cuda"):
        import torch  # deferred: heavy (torch)

        torch.cuda.synchronize(dev)


def measure_gemm(dev: str, n: int | None = None, iters: int = 10) -> float:
    import torch  # deferred: heavy (torch)

    gpu = dev.startswith("cuda")
    n = n or (8192 if gpu else 512)
    dtype = torch.bfloat16 if gpu else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    torch.matmul(a, b)
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b)
    _sync(dev)
    return 2.0 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def measure_mem_bw(dev: str, mbytes: int | None = None, iters: int = 5) -> float:
    import torch  # deferred: heavy (torch)

    gpu = dev.startswith("cuda")
    nbytes = (mbytes or (1024 if gpu else 64)) * 2**20
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    _sync(dev)
    return 2.0 * nbytes * iters / (time.perf_counter() - t0) / 1e9  # read + write


def probe_store(rank: int, world: int, host: str, port: int, timeout_s: float = 60.0):
    """The all-reduce's rendezvous store. Rank 0 hosts it on a socket it binds to ``host`` only and
    hands over (``master_listen_fd``): torch's own ``tcp://`` rendezvous would listen on every
    interface. The other ranks connect to ``host:port``."""

    from torch.distributed import TCPStore  # deferred: heavy (torch)

    timeout = datetime.timedelta(seconds=timeout_s)
    if rank != 0:
        return TCPStore(host, port, world, False, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    fd = socket.create_server((host, port), family=family, backlog=max(8, 2 * world)).detach()
    try:
        return TCPStore(host, port, world, True, timeout=timeout, wait_for_workers=False, master_listen_fd=fd)
    except Exception:
        os.close(fd)
        raise


def allreduce_busbw(
    rank: int, world: int, master: tuple[str, int], backend: str, nbytes: int, iters: int
) -> tuple[float, bool]:
    """One rank of the all-reduce test: (bus bandwidth GB/s as nccl-tests defines it, result correct)."""

    import torch  # deferred: heavy (torch)
    import torch.distributed as dist  # deferred: heavy (torch)

    store = probe_store(rank, world, *master)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        dev = "cpu"
        if backend == "nccl":
            local = rank % max(1, torch.cuda.device_count())
            torch.cuda.set_device(local)
            dev = f"cuda:{local}"
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        dist.all_reduce(x)
        _sync(dev)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        _sync(dev)
        dt = (time.perf_counter() - t0) / iters
        ok = bool(torch.allclose(x[:8].cpu(), torch.full((8,), float(world) ** (iters + 1))))
    finally:
        dist.destroy_process_group()
    # all-reduce bus bandwidth: size * 2 (n-1) / n / time
    return nbytes * 2 * (world - 1) / world / dt / 1e9, ok


def _allreduce_worker(rank: int, world: int, port: int, backend: str, nbytes: int, iters: int, q) -> None:
    try:
        bw, ok = allreduce_busbw(rank, world, ("127.0.0.1", port), backend, nbytes, iters)
        q.put((rank, bw, ok, ""))
    except Exception as exc:  # noqa: BLE001 - reported to the parent as a measurement error
        q.put((rank, 0.0, False, f"{type(exc).__name__}: {exc}"))


def _free_port() -> int:

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_allreduce(
    world: int | None = None, nbytes: int | None = None, iters: int = 5, timeout_s: float = 60.0
) -> tuple[float, int, str]:
    """Local processes: NCCL across the node's GPUs, else gloo on CPU. Returns (busbw GB/s, ranks, error)."""

    import torch  # deferred: heavy (torch)

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus >= 2 else "gloo"
    world = world or (gpus if gpus >= 2 else 2)
    nbytes = nbytes or (256 * 2**20 if backend == "nccl" else 4 * 2**20)
    ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock gloo
    q = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_allreduce_worker, args=(r, world, port, backend, nbytes, iters, q), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + timeout_s
    try:
        for _ in range(world):
            results.append(q.get(timeout=max(0.1, deadline - time.monotonic())))
    except Exception:  # noqa: BLE001 - queue.Empty: a rank hung
        pass
    for p in procs:
        p.join(timeout=max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)
    if len(results) < world:
        return 0.0, world, f"all-reduce did not finish within {timeout_s:g} s ({len(results)}/{world} ranks)"
    errors = [r[3] for r in results if r[3]] + [
        f"rank {r[0]}: wrong sum" for r in results if not r[2] and not r[3]
    ]
    return min(r[1] for r in results), world, "; ".join(errors)


def measure_disk_write(directory: str | Path | None = None, mbytes: int = 64) -> float:
    directory = Path(directory or tempfile.gettempdir())
    block = os.urandom(4 * 2**20)
    fd, name = tempfile.mkstemp(prefix=".stalwart-disk-", dir=directory)
    try:
        t0 = time.perf_counter()
        for _ in range(max(1, mbytes // 4)):
            os.write(fd, block)
        os.fsync(fd)
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(name)
    return max(1, mbytes // 4) * len(block) / dt / 1e9


def measure_train_step(dev: str) -> tuple[bool, str]:
    """One step of a tiny MLP: the loss must be finite and fall on the same batch."""
    import torch  # deferred: heavy (torch)

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(64, 32, generator=g).to(dev)
    y = torch.randn(64, 1, generator=g).to(dev)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss0 = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss0.backward()
    opt.step()
    with torch.no_grad():
        loss1 = torch.nn.functional.mse_loss(model(x), y)
    a, b = float(loss0.detach()), float(loss1)
    ok = a == a and b == b and abs(a) != float("inf") and b < a
    return ok, f"loss {a:.4f} -> {b:.4f} on {dev}"


def measure_active(
    disk_dir: str | Path | None = None,
    *,
    allreduce: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ActiveMeasurements:
    """Run the suite on this node's devices. Errors become part of the measurements, not exceptions.
    ``progress`` hears each test as it starts and ends (the suite takes seconds)."""
    devs = _devices()
    kind = "cuda" if devs[0].startswith("cuda") else "cpu"
    gemm: dict[str, float] = {}
    mem: dict[str, float] = {}
    secs: dict[str, float] = {}
    errors: list[str] = []
    busbw, ranks, disk, step_ok, step_detail = None, 0, None, None, ""

    def timed(name, fn):
        t0 = time.perf_counter()
        if progress is not None:
            progress(f"{name} ...")
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - any failure of a measurement is a finding
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return None
        finally:
            secs[name] = secs.get(name, 0.0) + time.perf_counter() - t0
            if progress is not None:
                progress(f"{name} done in {time.perf_counter() - t0:.1f}s")

    for d in devs:
        v = timed("gemm", lambda d=d: measure_gemm(d))
        if v is not None:
            gemm[d] = v
        v = timed("mem_bw", lambda d=d: measure_mem_bw(d))
        if v is not None:
            mem[d] = v
    if allreduce:
        r = timed("allreduce", measure_allreduce)
        if r is not None:
            busbw, ranks, err = r
            if err:
                errors.append(f"allreduce: {err}")
                busbw = None
    disk = timed("disk_write", lambda: measure_disk_write(disk_dir))
    r = timed("train_step", lambda: measure_train_step(devs[0]))
    if r is not None:
        step_ok, step_detail = r
    return ActiveMeasurements(kind, gemm, mem, busbw, ranks, disk, step_ok, step_detail, tuple(errors), secs)


def _f(code: str, subject: str, sev: Severity, msg: str, **ev: object) -> Finding:
    return Finding(check="active", code=code, subject=subject, severity=sev, message=msg, evidence=ev)


def check_active(m: ActiveMeasurements, exp: ActiveExpectations) -> list[Finding]:
    out: list[Finding] = []
    best = max(m.gemm_tflops.values(), default=0.0)
    for dev, tf in m.gemm_tflops.items():
        if tf < exp.gemm_tflops:
            out.append(
                _f(
                    "active.gemm.low",
                    dev,
                    Severity.FAIL,
                    f"GEMM {tf:.3g} TFLOPS < expected {exp.gemm_tflops:g}",
                    tflops=tf,
                    expected=exp.gemm_tflops,
                )
            )
        elif best and tf < exp.gemm_vs_best * best:
            out.append(
                _f(
                    "active.gemm.slowest",
                    dev,
                    Severity.FAIL,
                    f"GEMM {tf:.3g} TFLOPS is {tf / best:.0%} of the node's best device ({best:.3g})",
                    tflops=tf,
                    best=best,
                    min_fraction=exp.gemm_vs_best,
                )
            )
        else:
            out.append(_f("active.gemm", dev, Severity.OK, f"GEMM {tf:.3g} TFLOPS", tflops=tf))
    for dev, bw in m.mem_bw_gbps.items():
        sev = Severity.FAIL if bw < exp.mem_bw_gbps else Severity.OK
        out.append(
            _f(
                "active.membw" + (".low" if sev else ""),
                dev,
                sev,
                f"memory bandwidth {bw:.3g} GB/s" + (f" < expected {exp.mem_bw_gbps:g}" if sev else ""),
                gbps=bw,
                expected=exp.mem_bw_gbps,
            )
        )
    if m.allreduce_busbw_gbps is not None:
        bw = m.allreduce_busbw_gbps
        sev = Severity.FAIL if bw < exp.allreduce_busbw_gbps else Severity.OK
        out.append(
            _f(
                "active.allreduce" + (".low" if sev else ""),
                f"{m.allreduce_ranks} ranks",
                sev,
                f"all-reduce bus bandwidth {bw:.3g} GB/s"
                + (f" < expected {exp.allreduce_busbw_gbps:g}" if sev else ""),
                busbw_gbps=bw,
                expected=exp.allreduce_busbw_gbps,
            )
        )
    if m.disk_write_gbps is not None:
        bw = m.disk_write_gbps
        sev = Severity.FAIL if bw < exp.disk_write_gbps else Severity.OK
        out.append(
            _f(
                "active.disk" + (".low" if sev else ""),
                "local disk",
                sev,
                f"fsync'd write {bw:.3g} GB/s" + (f" < expected {exp.disk_write_gbps:g}" if sev else ""),
                gbps=bw,
                expected=exp.disk_write_gbps,
            )
        )
    if m.train_step_ok is not None:
        sev = Severity.OK if m.train_step_ok else Severity.FAIL
        out.append(
            _f(
                "active.train_step" + ("" if m.train_step_ok else ".failed"),
                "model",
                sev,
                f"training step: {m.train_step_detail}",
            )
        )
    for e in m.errors:
        out.append(
            _f("active.error", e.split(":", 1)[0], Severity.FAIL, f"active check failed: {e}", error=e)
        )
    return out
