"""Emergency checkpoint on SIGTERM / SIGUSR1 in a real training process, within its deadline.

The trainer stages every step to the memory tier only (disk interval 1000 steps); on the signal its
handler calls ``engine.emergency_persist(deadline)``, which must make the newest staged step durable
on disk. A fresh process that lost the memory tier then resumes from exactly that step."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
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
    return {"model": {"w": torch.randn(50_000, generator=g)}, "optim": {"m": torch.randn(50_000, generator=g)},
            "step": step}


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
        (root / "emergency.json").write_text(json.dumps({
            "signal": signum, "step": res.step, "committed": res.committed, "tier": res.tier,
            "duration_s": res.duration_s, "reason": res.reason, "last_staged": state["step"]}))
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
    exact = torch.equal(target["model"]["w"], ref["model"]["w"]) and torch.equal(target["optim"]["m"], ref["optim"]["m"])
    (root / "resume.json").write_text(json.dumps({"step": got.step, "tier": got.tier, "exact": exact}))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_signal_makes_the_newest_staged_step_durable_within_the_deadline(tmp_path, sig):
    proc = subprocess.Popen([sys.executable, str(HERE), "train", str(tmp_path)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ((tmp_path / "progress").exists() and int((tmp_path / "progress").read_text() or 0) >= 5):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the trainer made no progress"
        time.sleep(0.05)
    proc.send_signal(sig)
    assert proc.wait(timeout=DEADLINE_S + 30) == 0, proc.stderr.read()[-3000:]
    res = json.loads((tmp_path / "emergency.json").read_text())
    assert res["signal"] == sig and res["committed"] and res["tier"] == "disk", res
    assert res["duration_s"] <= DEADLINE_S
    assert res["step"] >= 5 and res["step"] in (res["last_staged"], res["last_staged"] + 1)
    shutil.rmtree(tmp_path / "shm")  # the node's memory is gone: only the emergency save remains
    subprocess.run([sys.executable, str(HERE), "resume", str(tmp_path)], check=True, timeout=120)
    rep = json.loads((tmp_path / "resume.json").read_text())
    assert rep == {"step": res["step"], "tier": "disk", "exact": True}


if __name__ == "__main__":
    (_train if sys.argv[1] == "train" else _resume)(Path(sys.argv[2]))
