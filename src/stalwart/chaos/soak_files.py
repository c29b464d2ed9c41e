"""What the soak harness does to processes and files: live faults on a running job, damage between
jobs, a real tmpfs to fill, and the comparison of a run's end with the clean run's."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

from typing_extensions import assert_never

from .soak_plan import PlannedFault, SoakFault
from .soak_verdict import good_versions

_FILLER = ".soak-filler"


def live_fault(f: PlannedFault, proc: subprocess.Popen[str], run_dir: Path) -> bool:
    """Do a live fault to the job ``proc`` runs; whether it was done."""
    match f.kind:
        case SoakFault.SIGKILL_WORKER | SoakFault.SIGSTOP_WORKER:
            workers = children(proc.pid)
            if not workers:
                return False
            pid = workers[f.rank % len(workers)]
            os.kill(pid, signal.SIGKILL if f.kind is SoakFault.SIGKILL_WORKER else signal.SIGSTOP)
        case SoakFault.SIGKILL_AGENT:
            os.killpg(proc.pid, signal.SIGKILL)  # the agent and its workers, as a lost node
        case SoakFault.SIGTERM_REQUEUE:
            proc.send_signal(signal.SIGTERM)
        case SoakFault.FULL_DISK | SoakFault.FULL_DISK_END:
            fill(run_dir / "checkpoints")
        case SoakFault.FULL_DISK_EMERGENCY:
            fill(run_dir / "checkpoints")
            proc.send_signal(signal.SIGTERM)
        case (
            SoakFault.CRASH
            | SoakFault.EXIT
            | SoakFault.HANG
            | SoakFault.KILL_AGENT
            | SoakFault.CORRUPT_CHECKPOINT
            | SoakFault.TRUNCATE_CHECKPOINT
            | SoakFault.DELETE_CKPT_FILE
            | SoakFault.TRUNCATE_CKPT_FILE
            | SoakFault.CORRUPT_MANIFEST
            | SoakFault.CORRUPT_LEDGER
        ):
            return False  # not a live fault
        case _:
            assert_never(f.kind)
    return True


def damage_between(kind: SoakFault | str, run_dir: Path, rng: random.Random) -> tuple[bool, int | None]:
    """Damage the newest committed checkpoint (or a side ledger) between jobs; return whether
    something was damaged and the checkpoint step hit (None for a ledger)."""
    fault = SoakFault(kind)
    match fault:
        case SoakFault.CORRUPT_LEDGER:
            return _corrupt_ledger(run_dir, rng), None
        case SoakFault.CORRUPT_MANIFEST | SoakFault.DELETE_CKPT_FILE | SoakFault.TRUNCATE_CKPT_FILE:
            return _damage_newest(fault, run_dir, rng)
        case (
            SoakFault.CRASH
            | SoakFault.EXIT
            | SoakFault.HANG
            | SoakFault.KILL_AGENT
            | SoakFault.CORRUPT_CHECKPOINT
            | SoakFault.TRUNCATE_CHECKPOINT
            | SoakFault.SIGKILL_WORKER
            | SoakFault.SIGSTOP_WORKER
            | SoakFault.SIGKILL_AGENT
            | SoakFault.SIGTERM_REQUEUE
            | SoakFault.FULL_DISK
            | SoakFault.FULL_DISK_EMERGENCY
            | SoakFault.FULL_DISK_END
        ):
            return False, None  # not done between jobs
        case _:
            assert_never(fault)


def _damage_newest(fault: SoakFault, run_dir: Path, rng: random.Random) -> tuple[bool, int | None]:
    versions = good_versions(run_dir / "checkpoints")
    if not versions:
        return False, None
    step = max(versions)
    path = versions[step]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name != "MANIFEST.json")
    if fault is SoakFault.CORRUPT_MANIFEST:
        (path / "MANIFEST.json").write_text(rng.choice(["null", "[]", '{"files": []}', "{not json"]))
    elif not files:
        return False, None
    elif fault is SoakFault.DELETE_CKPT_FILE:
        rng.choice(files).unlink()
    else:
        victim = rng.choice(files)
        with open(victim, "r+b") as fh:
            fh.truncate(max(0, victim.stat().st_size // 2))
    return True, step


def _corrupt_ledger(run_dir: Path, rng: random.Random) -> bool:
    files = sorted((run_dir / "ledger").glob("worker-*.ledger"))
    if not files:
        return False
    victim = rng.choice(files)
    with open(victim, "r+b") as fh:
        fh.seek(0)
        fh.write(b"garbage, not a sqlite database" * 8)
    return True


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return sorted(int(x) for x in text.split())


def kill_tree(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def same_params(a: Path, b: Path) -> bool:
    import torch  # deferred: heavy (torch)

    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return bool(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x))


def mount_tmpfs(path: Path, size: int) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True
    )
    return r.returncode == 0


def unmount(path: Path) -> None:
    if path.exists() and os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path) -> None:
    """Fill the filesystem under ``path`` to the last byte."""
    try:
        with open(path / _FILLER, "wb") as fh:
            block = b"\0" * (64 << 10)
            while True:
                fh.write(block)
                fh.flush()
    except OSError:
        pass


def free_filler(path: Path) -> None:
    (path / _FILLER).unlink(missing_ok=True)
