"""``stalwart plan --ledger`` on a real run whose one failure was a ``kill -9`` by hand: it exits 0 and
says which failure rates it used and why (one kill is no fleet's failure rate), and so does a run the
user marks with ``--faults-are-tests``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from stalwart.events import StepCompleted, WorkersStarted

from .runner import EXAMPLE, events, events_so_far, stalwart

pytestmark = pytest.mark.e2e


def test_plan_on_a_run_killed_by_hand_exits_0_and_says_which_rates_and_why(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "stalwart.cli", "run", "-q", "--nproc-per-node", "2", "--run-dir", str(run)]
    p = subprocess.Popen(
        [*cmd, *EXAMPLE, "--steps", "60", "--checkpoint-every", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # training under way: a step past the first checkpoint
            if any(e.step >= 12 for e in events_so_far(run, StepCompleted)):
                break
            assert p.poll() is None, p.communicate()[0]
            time.sleep(0.2)
        started = events(run, WorkersStarted)[-1]
        os.kill(started.pids[started.global_ranks.index(1)], signal.SIGKILL)  # the user's kill -9
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    assert p.returncode == 0, out
    argv = ["plan", "--ledger", str(run), "--gpus", "1024", "--days", "2", "--trials", "10"]
    plan = stalwart(*argv, "--json")
    assert plan.code == 0, plan.err
    d = json.loads(plan.out)
    assert d["rates"]["source"] == "published", d["rates"]
    assert "1 failure in" in d["rates"]["reason"] and "too little to estimate a rate" in d["rates"]["reason"]
    assert any(n.startswith("detection latency") for n in d["notes"])  # the run's own times are used
    marked = stalwart(*argv, "--faults-are-tests", "--json")
    assert marked.code == 0 and "marked as tests" in json.loads(marked.out)["rates"]["reason"]
    tables = stalwart(*argv)  # and the tables say it, to a person
    assert tables.code == 0 and "too little to estimate a rate" in " ".join(tables.out.split())
