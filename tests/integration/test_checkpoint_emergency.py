"""Emergency checkpoint on SIGTERM / SIGUSR1 in a real training process, within its deadline.

The trainer stages every step to the memory tier only (disk interval 1000 steps); on the signal its
handler calls ``engine.emergency_persist(deadline)``, which must make the newest staged step durable
on disk. A fresh process that lost the memory tier then resumes from exactly that step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
DEADLINE_S = 20.0
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def state_for(step: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(50_000, generator=g)},
        "optim": {"m": torch.randn(50_000, generator=g)},
        "step": step,
    }


def _tiers(root: Path, memory: bool = True):
    from stalwart.checkpoint.tiers import TierConfig

    disk = TierConfig(name="disk", kind="local", location=str(root / "disk"), every_steps=1000)
    return ([TierConfig(name="mem", kind="memory", location=str(root / "shm"))] if memory else []) + [disk]


def _train(root: Path) -> None:
    from stalwart.checkpoint.engine import CheckpointEngine

    eng = CheckpointEngine(_tiers(root))
    state = {"step": 0}

    def on_signal(signum, frame):
        res = eng.emergency_persist(DEADLINE_S)
        (root / "emergency.json").write_text(
            json.dumps(
                {
                    "signal": signum,
                    "step": res.step,
                    "committed": res.committed,
                    "tier": res.tier,
                    "duration_s": res.duration_s,
                    "reason": res.reason,
                    "last_staged": state["step"],
                }
            )
        )
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    step = 0
    while True:
        step += 1
        eng.save(step, state_for(step)).future.result()  # memory tier, every step
        state["step"] = step
        (root / "progress").write_text(str(step))
        time.sleep(0.01)


def _resume(root: Path) -> None:
    import torch

    from stalwart.checkpoint.engine import CheckpointEngine

    eng = CheckpointEngine(_tiers(root, memory=False))
    target = {"model": {"w": torch.zeros(50_000)}, "optim": {"m": torch.zeros(50_000)}, "step": -1}
    got = eng.load_latest(target)
    eng.close()
    ref = state_for(got.step)
    exact = torch.equal(target["model"]["w"], ref["model"]["w"]) and torch.equal(
        target["optim"]["m"], ref["optim"]["m"]
    )
    (root / "resume.json").write_text(json.dumps({"step": got.step, "tier": got.tier, "exact": exact}))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_signal_makes_the_newest_staged_step_durable_within_the_deadline(tmp_path, sig):
    import warm  # deferred: this file is also the trainer script, where tests/ need not be on the path

    proc = warm.start(HERE, ["train", str(tmp_path)], dict(os.environ))  # forked warm
    deadline = time.monotonic() + 120
    while not ((tmp_path / "progress").exists() and int((tmp_path / "progress").read_text() or 0) >= 5):
        assert proc.poll() is None, proc.output()[-3000:]
        assert time.monotonic() < deadline, "the trainer made no progress"
        time.sleep(0.05)
    proc.send_signal(sig)
    assert proc.wait(timeout=DEADLINE_S + 30) == 0, proc.output()[-3000:]
    res = json.loads((tmp_path / "emergency.json").read_text())
    assert res["signal"] == sig and res["committed"] and res["tier"] == "disk", res
    assert res["duration_s"] <= DEADLINE_S
    assert res["step"] >= 5 and res["step"] in (res["last_staged"], res["last_staged"] + 1)
    shutil.rmtree(tmp_path / "shm")  # the node's memory is gone: only the emergency save remains
    code, out = warm.run(HERE, ["resume", str(tmp_path)], timeout=120)
    assert code == 0, out[-3000:]
    rep = json.loads((tmp_path / "resume.json").read_text())
    assert rep == {"step": res["step"], "tier": "disk", "exact": True}


def _train_ranks(root: Path) -> None:
    """Two gloo ranks; the handler only sets a flag, and the ranks agree at the step boundary."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from stalwart.checkpoint.engine import CheckpointEngine

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    eng = CheckpointEngine(_tiers(root), rank=rank, world_size=2)
    flag = {"stop": False}
    signal.signal(signal.SIGTERM, lambda s, f: flag.__setitem__("stop", True))
    step = 0
    while True:
        stop = torch.tensor([1 if flag["stop"] else 0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # what the SDK does at each step boundary
        if stop.item():
            res = eng.emergency_persist(DEADLINE_S)
            (root / f"emergency-{rank}.json").write_text(
                json.dumps(
                    {
                        "step": res.step,
                        "committed": res.committed,
                        "tier": res.tier,
                        "duration_s": res.duration_s,
                        "staged": int((root / "progress").read_text()),
                    }
                )
            )
            eng.close()
            dist.destroy_process_group()
            return
        step += 1
        ticket = eng.save(step, state_for(step), {"rank": rank, "step": step})  # skipped while busy
        if rank == 0 and not ticket.skipped:
            (root / "progress").write_text(str(step))  # the newest staged step
        time.sleep(0.01)


def test_two_ranks_agree_at_the_step_boundary_and_commit_within_the_deadline(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import warm  # deferred: as above

    procs = [warm.start(HERE, ["ranks", str(tmp_path)], warm.rank_env(r, 2, port)) for r in range(2)]
    deadline = time.monotonic() + 120
    while not ((tmp_path / "progress").exists() and int((tmp_path / "progress").read_text() or 0) >= 5):
        assert all(p.poll() is None for p in procs), [p.output()[-2000:] for p in procs]
        assert time.monotonic() < deadline, "the ranks made no progress"
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)  # one rank is told; the other learns at the step boundary
    for p in procs:
        assert p.wait(timeout=DEADLINE_S + 60) == 0, p.output()[-3000:]
    res = [json.loads((tmp_path / f"emergency-{r}.json").read_text()) for r in range(2)]
    assert res[0]["step"] == res[1]["step"] == res[0]["staged"] >= 5  # the newest staged step
    assert all(r["committed"] and r["tier"] == "disk" and r["duration_s"] <= DEADLINE_S for r in res), res
    from stalwart.checkpoint.manifest import verify

    manifest, _ = verify(tmp_path / "disk" / f"step-{res[0]['step']:09d}")
    assert manifest.world_size == 2 and {"rank-0.pt", "rank-1.pt"} <= set(manifest.files)
    shutil.rmtree(tmp_path / "shm")
    code, out = warm.run(HERE, ["resume", str(tmp_path)], timeout=120)
    assert code == 0, out[-3000:]
    rep = json.loads((tmp_path / "resume.json").read_text())
    assert rep == {"step": res[0]["step"], "tier": "disk", "exact": True}


if __name__ == "__main__":
    {"train": _train, "resume": _resume, "ranks": _train_ranks}[sys.argv[1]](Path(sys.argv[2]))
