"""All-reduce bus bandwidth across nodes: one process per node, started by ``srun`` (or by hand).

    srun -N4 --ntasks-per-node=1 python -m stalwart.health.allreduce_probe --master HOST:PORT

Rank and world size come from ``SLURM_PROCID``/``SLURM_NTASKS`` (or ``RANK``/``WORLD_SIZE``).
Rank 0 prints one JSON line: ``{"busbw_gbps", "ranks", "ok", "verdict", "reason"}``; the exit code
is 0 when the bandwidth meets ``--expect`` and the sum is right, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from .active import CPU_EXPECTATIONS, H100_EXPECTATIONS, ActiveMeasurements, allreduce_busbw, check_active
from .findings import CheckStatus, Finding, Severity
from .rules import load_rules


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stalwart.health.allreduce_probe")
    ap.add_argument(
        "--master", required=True, help="HOST:PORT of rank 0's rendezvous (rank 0 listens on HOST only)"
    )
    ap.add_argument("--mbytes", type=int, default=None, help="message size (default 4 MiB CPU, 256 MiB GPU)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--expect", type=float, default=None, help="minimum bus bandwidth, GB/s")
    args = ap.parse_args(argv)
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
    world = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")))
    import torch  # deferred: heavy (torch)

    gpu = torch.cuda.is_available()
    backend = "nccl" if gpu else "gloo"
    nbytes = (args.mbytes or (256 if gpu else 4)) * 2**20
    try:
        host, _, port = args.master.rpartition(":")  # rank 0 listens on this address only
        bw, ok = allreduce_busbw(rank, world, (host.strip("[]"), int(port)), backend, nbytes, args.iters)
        err: tuple[str, ...] = ()
    except Exception as exc:  # noqa: BLE001 - a failed collective is the finding
        bw, ok, err = 0.0, False, (f"allreduce: {type(exc).__name__}: {exc}",)
    exp = H100_EXPECTATIONS if gpu else CPU_EXPECTATIONS
    if args.expect is not None:
        exp = replace(exp, allreduce_busbw_gbps=args.expect)
    m = ActiveMeasurements(
        "cuda" if gpu else "cpu", allreduce_busbw_gbps=None if err else bw, allreduce_ranks=world, errors=err
    )
    findings = check_active(m, exp)
    if not ok and not err:
        findings.append(
            Finding(
                "active",
                "active.allreduce.wrong",
                f"{world} ranks",
                Severity.FAIL,
                "all-reduce returned a wrong sum",
            )
        )
    verdict = load_rules().evaluate(findings)
    if rank == 0:
        print(
            json.dumps(
                {
                    "busbw_gbps": bw,
                    "ranks": world,
                    "ok": ok,
                    "verdict": verdict.status.value,
                    "reason": verdict.reason,
                }
            ),
            flush=True,
        )
    return 0 if verdict.status is not CheckStatus.FAIL else 1


if __name__ == "__main__":
    sys.exit(main())
