"""The README as a new user reads it: every command in its code blocks runs.

Each command is listed below exactly as the README writes it. A command that needs a cluster, a long
run or more cores than a test machine has is marked with its reason and run in a shortened form that
keeps its point. A command added to the README without an entry here fails the test."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .runner import console, events

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RUN = "stalwart-runs/<run-id>"  # the README's placeholder for a run directory

TRAIN_PY = """
import argparse
import torch
from stalwart.train import Session

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=1e-3)
lr = p.parse_args().lr
session = Session()
session.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1)) if session.world_size > 1 \\
    else torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=lr)
sched = torch.optim.lr_scheduler.StepLR(opt, 2)
state = {"model": model, "optimizer": opt, "scheduler": sched}
for step in session.loop(6, state, checkpoint_every=3):
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
session.finish()
"""

# (command as the README writes it, command run (None: as written), reason for a shortened form)
RULES = [
    (
        "./dev.sh test",
        "./dev.sh test --collect-only -q tests/unit",
        "the whole suite takes about half an hour on 2 cores (docs/testing.md); collecting the unit tests proves dev.sh sets up and starts pytest",
    ),
    (
        "./dev.sh fast",
        "./dev.sh fast --collect-only -q",
        "the two tiers take about 4 min; collecting them proves dev.sh starts pytest on those tiers",
    ),
    (
        "stalwart run --nproc-per-node 4 --max-restarts 3 train.py --lr 3e-4",
        "stalwart run --nproc-per-node 2 --max-restarts 3 train.py --lr 3e-4",
        "2 workers on a 2-core test machine; train.py is a 6-step SDK script written by the test",
    ),
    (
        "stalwart run --nnodes 1:2 --nproc-per-node 8 --rdzv-endpoint head:29400 --rdzv-id job42 train.py",
        "stalwart run --nnodes 1 --nproc-per-node 2 --rdzv-endpoint 127.0.0.1:{port} --rdzv-id job42 train.py",
        "needs two nodes named head and another; one node through the same c10d rendezvous flags "
        "(two agents: tests/e2e/test_elastic_and_preemption.py)",
    ),
    (
        "stalwart run --nproc-per-node 4 --chaos crash@rank=1,step=40 --chaos hang@rank=2,step=90 "
        "--chaos slow@rank=3,factor=1.5 -m stalwart.examples.charlm --steps 200",
        "stalwart run --nproc-per-node 2 --chaos crash@rank=1,step=12 --chaos hang@rank=0,step=30 "
        "--chaos slow@rank=1,factor=1.5 -m stalwart.examples.charlm --steps 40",
        "a long run on 4 workers; 2 workers and 40 steps keep a crash, a hang and a slow rank",
    ),
    (f"stalwart report {RUN}", None, ""),
    (f"stalwart report {RUN} --json", None, ""),
    ("stalwart health check --json", None, ""),
    ("stalwart health check --active", None, ""),
    ("stalwart nodes", None, ""),
    (
        "stalwart sim --gpus 16384 --days 54",
        "stalwart sim --gpus 16384 --days 54 --trials 20",
        "the default trials take minutes on 2 cores; 20 trials exercise the same path",
    ),
    (f"stalwart plan --ledger {RUN} --plot plots/", None, ""),
    (
        "./dev.sh demo",
        "stalwart demo --steps 160 --workers 2",
        "dev.sh's set-up runs in ./dev.sh test above; the smallest demo the command allows (31-47 s "
        "against 35-51 s for the default on a busy 2-core machine), with every detector's recall checked",
    ),
]


def readme_commands() -> list[str]:
    text = README.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = re.sub(r"\s+#.*$", "", cmd).strip()
            if cmd:
                out.append(re.sub(r"\s+", " ", cmd))
    return out


def test_every_readme_command_has_a_rule():
    assert sorted(readme_commands()) == sorted(r[0] for r in RULES)


def _argv(cmd: str) -> list[str]:
    argv = shlex.split(cmd)
    if argv[0] == "stalwart":
        return [sys.executable, "-m", "stalwart.cli", *argv[1:]]
    return argv


def test_readme_commands_run(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN_PY)
    env = {**os.environ, "COLUMNS": "80"}
    run_dir = None
    for written, short, reason in RULES:
        cmd = short or written
        assert short is None or reason, f"a shortened command needs its reason: {written}"
        if "{port}" in cmd:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                cmd = cmd.format(port=s.getsockname()[1])
        if RUN in cmd:
            assert run_dir is not None, "a run must come before the commands that read it"
            cmd = cmd.replace(RUN, str(run_dir))
        cwd = ROOT if cmd.startswith("./dev.sh") else tmp_path
        p = subprocess.run(_argv(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        ok = {1 if "health check" in cmd else 0, 0}  # health check: 1 means the node failed a check
        assert p.returncode in ok, f"{cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        if "--chaos" in cmd:
            runs = sorted((tmp_path / "stalwart-runs").iterdir(), key=lambda d: d.stat().st_mtime)
            run_dir = runs[-1]
            said = console(p.stdout)
            assert "crash detected" in said and "hang detected" in said
        if cmd.startswith("stalwart run") or cmd.startswith("stalwart demo"):
            assert "Where the wall time went" in p.stdout, "the run must end with its report"
        if cmd.startswith("stalwart demo"):
            _every_injected_fault_caught(tmp_path, p.stdout)
        if cmd.startswith("./dev.sh fast"):  # the inner loop: the two fast tiers and nothing else
            assert (
                "tests/unit/" in p.stdout
                and "tests/integration/" in p.stdout
                and "tests/e2e/" not in p.stdout
            )
        if "--json" in cmd:
            json.loads(p.stdout)
        if cmd.startswith("stalwart nodes"):
            assert "vm" in p.stdout or "no nodes known" in p.stdout
        if "--plot" in cmd:
            assert (tmp_path / "plots").is_dir() and any((tmp_path / "plots").iterdir())


def _every_injected_fault_caught(cwd: Path, out: str) -> None:
    """The demo shows each mechanism working: every detector its plan injected faults for caught them
    all (a corrupt checkpoint that no recovery needed read used to show as recall 0%), and the
    console said so."""
    from stalwart.diagnose.precision import detector_stats

    [demo] = sorted((cwd / "stalwart-runs").glob("demo-*"))
    stats = [s for s in detector_stats(events(demo)) if s.faults]
    assert {s.detector for s in stats} == {"crash", "hang", "straggler", "checkpoint_verify"}, stats
    assert all(s.caught == s.faults for s in stats), stats
    said = console(out)
    assert "checkpoint damaged: step 140" in said and "set aside" in said
    assert "local tier: flipped 16 bytes" in said and "memory tier: flipped 16 bytes" in said


def test_readme_sdk_snippet_runs_as_written(tmp_path, monkeypatch):
    """The SDK snippet, executed with the names it leaves to the reader defined by the test."""
    import torch

    code = next(
        b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "Session()" in b
    )
    assert "opt.zero_grad()" in code
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = {
        "model": model,
        "opt": opt,
        "sched": torch.optim.lr_scheduler.StepLR(opt, 2),
        "total_steps": 4,
        "loss_fn": torch.nn.functional.mse_loss,
        "next_batch": lambda step: (torch.ones(2, 4) * step, torch.zeros(2, 1)),
    }
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"}, names)  # noqa: S102 - our own README
    assert names["session"].completed == 4


def test_readme_python_snippets_compile():
    for code in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S):
        compile(code, "README.md", "exec")
