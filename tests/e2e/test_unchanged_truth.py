"""Issue 38's acceptance, point 1: what Stalwart says of an unchanged script is true.

A plain DDP script (gloo, DistributedSampler, its own ``torch.save`` every 10 steps and a resume
from it; no Stalwart import, ``scripts/ddp_steps.py``) under ``stalwart run --nproc-per-node 2``:

* rank 1 SIGKILLed just after the step-20 checkpoint: the report and the dashboard count the
  script's 60 steps (the hooks' counter used to start again at 0 in every attempt: "40 steps"), the
  lost work is the steps after the checkpoint (at most 2 steps' time; the whole first attempt was
  booked as lost), and the recovery has a total, equal to the console's "recovered ... after the
  fault" (the load phase and the total were "-");
* SIGTERM to the agent just after the step-20 checkpoint, and the job requeued: 60 steps, and the
  requeued job says it resumed at step 20;
* a user error raised at step 25 is "at step 25" in the decision and the report (it said step 5).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from proctree import cmdline, descendants
from stalwart.account.report import build
from stalwart.ledger import read_merged
from stalwart.serve.snapshot import take

from .runner import console

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).parent / "scripts" / "ddp_steps.py"
RUN = [
    sys.executable,
    "-m",
    "stalwart.cli",
    "run",
    "--no-health-gate",
    "--nproc-per-node",
    "2",
    "--run-dir",
    "run",
]
STEP_S = 0.25  # each step sleeps this long after its optimizer step: the kill lands inside step 20


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    cmd = [*RUN, str(SCRIPT), "--step-s", str(STEP_S), *args]
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _when_saved(cwd: Path, p: subprocess.Popen[str], step: int) -> None:
    """Return as soon as the script's checkpoint of ``step`` exists (the script touches a marker)."""
    deadline = time.monotonic() + 240
    while not (cwd / f"saved-{step}").exists():
        assert p.poll() is None, f"the job ended before its checkpoint of step {step}"
        assert time.monotonic() < deadline, f"no checkpoint of step {step} in 240 s"
        time.sleep(0.02)


def _rank_pid(job: subprocess.Popen[str], rank: int) -> int:
    """The pid of ``rank`` below this test's own ``stalwart run`` (never another test's: the title
    is looked up among the job's descendants only)."""
    title = re.compile(rf"ddp_steps\.py.*stalwart rank {rank} ")
    pids = sorted(p for p in descendants(job.pid) if title.search(cmdline(p)))
    assert pids, f"no process of rank {rank}"
    return pids[0]


def _finish(p: subprocess.Popen[str]) -> str:
    try:
        text, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return console(text)  # the console's lines whole, wherever 80 columns broke them


def _report(cwd: Path) -> dict[str, Any]:
    return json.loads(json.dumps(build(cwd / "run"), default=str))


def test_a_killed_rank_keeps_the_scripts_steps_and_loses_only_the_step_after_its_checkpoint(tmp_path: Path):
    p = _start(tmp_path)
    try:
        _when_saved(tmp_path, p, 20)
        os.kill(_rank_pid(p, 1), signal.SIGKILL)
    finally:
        text = _finish(p)
    assert p.returncode == 0, text[-3000:]
    rep = _report(tmp_path)
    assert rep["steps_completed"] == 60, text[-2000:]
    (cost,) = rep["interruptions"]
    assert cost["lost_work_s"] <= 2 * rep["ideal_step_s"], (cost, rep["ideal_step_s"])
    (rec,) = rep["recoveries"]
    assert rec["total_s"] is not None and rec["phases"]["load"] is not None, rec
    said = re.search(r"recovered on the \w+ path ([0-9.]+)s after the fault", text)
    assert said, text[-2000:]
    console_s = float(said.group(1))
    # the same measurement told twice: equal within 10% (plus the console's rounding to 0.01 s)
    assert abs(rec["total_s"] - console_s) <= 0.1 * console_s + 0.01, (rec, console_s)
    assert rep["reliability"]["mttr_s"]["total_s"] == pytest.approx(rec["total_s"], abs=0.02)
    (resumed,) = rep["script_resumes"]
    assert resumed["step"] == 20 and resumed["how"].startswith("fingerprint: resumed at step 20")
    snap = take(read_merged(tmp_path / "run"), time.time())
    assert {r.rank: r.last_step for r in snap.ranks} == {0: 59, 1: 59}
    assert snap.steps_completed == 60
    assert snap.checkpoints is not None and snap.checkpoints.script_resumes == (
        "attempt 1: resumed at step 20: the parameters are those after step 19",
    )
    # where the start-up went: every phase measured, told by the console and the report alike
    (start,) = rep["startup"]
    assert all(v is not None for v in start["phases"].values()), start
    told = re.search(r"start-up ([0-9.]+)s before the first step: Python start and imports", text)
    assert told, text[:3000]
    assert float(told.group(1)) == pytest.approx(start["total_s"], abs=0.01)


def test_a_requeued_job_resumes_the_scripts_count_where_its_checkpoint_was(tmp_path: Path):
    p = _start(tmp_path)
    try:
        _when_saved(tmp_path, p, 20)
        p.send_signal(signal.SIGTERM)
    finally:
        text = _finish(p)
    assert p.returncode == 76, text[-3000:]  # preempted: the scheduler requeues (the script saved its own)
    again = _start(tmp_path)
    text2 = _finish(again)
    assert again.returncode == 0, text2[-3000:]
    rep = _report(tmp_path)
    assert rep["jobs"] == 2
    assert rep["steps_completed"] == 60, text2[-2000:]
    (resumed,) = rep["script_resumes"]
    assert resumed["step"] == 20 and resumed["attempt"] == 0  # the requeued job's first attempt
    productive = rep["buckets_s"]["productive"]
    assert productive <= 60 * rep["ideal_step_s"] * 1.2 + 1.0, (productive, rep["ideal_step_s"])


def test_a_user_error_is_reported_at_the_scripts_step(tmp_path: Path):
    p = _start(tmp_path, "--raise-at", "25", "--steps", "30")
    text = _finish(p)
    assert p.returncode == 3, text[-3000:]
    assert "user error at step 25" in text
    rep = _report(tmp_path)
    assert rep["verdict"].startswith("user error at step 25"), rep["verdict"]
    assert {c["step"] for c in rep["interruptions"]} == {25}
