"""A finished run stays finished (pure), and a changed script under the same run id is bad input."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from stalwart.errors import ConfigError
from stalwart.events import JobEnded, StepCompleted
from stalwart.launch.finished_run import finished, last_step
from stalwart.settings.run_config import RunConfig, claim_run_dir
from stalwart.settings.script_fingerprint import fingerprint

CTX = dict(run_id="r", node="n0", attempt=0)


def ended(ts: float, outcome: str, code: int = 0) -> JobEnded:
    return JobEnded(
        ts=ts, verdict=f"{outcome} verdict", outcome=outcome, exit_code=code, requeue_helps=False, **CTX
    )


def step(ts: float, n: int) -> StepCompleted:
    return StepCompleted(ts=ts, rank=0, step=n, start=ts - 0.1, duration=0.1, sections={}, **CTX)


def test_the_newest_verdict_decides_and_the_message_says_how_to_start_anew():
    assert finished([]) is None
    assert finished([step(1, 0), ended(2, "preempted", 76)]) is None  # a requeue resumes it
    done = finished([step(1, 0), ended(2, "preempted", 76), step(3, 79), ended(4, "succeeded")])
    assert done is not None and done.final_step == 79 and done.ended_at == 4
    text = done.message("job-1", Path("/runs/job-1"))
    assert "already finished at step 79" in text and "nothing launched" in text and "--run-id" in text
    assert finished([ended(2, "succeeded"), step(3, 5), ended(4, "infra_exhausted", 75)]) is None


def test_the_last_step_needs_no_verdict():
    # the finished mark is left before the verdict is written: its step comes from the steps
    assert last_step([]) == -1
    assert last_step([step(1, 3), step(2, 79), ended(3, "preempted", 76), step(4, 40)]) == 79


def _cfg(tmp_path: Path, script: Path, **kw) -> RunConfig:
    return RunConfig(script=str(script), run_dir=tmp_path / "run", run_id="r1", **kw)


def test_a_changed_script_is_bad_input_unless_told_to_continue(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("print('v1')\n")
    claim_run_dir(_cfg(tmp_path, script))
    claim_run_dir(_cfg(tmp_path, script))  # the same script again: the same run
    script.write_text("print('v2')\n")
    with pytest.raises(ConfigError) as err:
        claim_run_dir(_cfg(tmp_path, script))
    assert "changed" in str(err.value) and "--continue-changed" in str(err.value)
    claim_run_dir(_cfg(tmp_path, script, continue_changed=True))
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())
    assert recorded["sha256"] == fingerprint(str(script), False, False)
    assert stat.S_IMODE((tmp_path / "run" / "run.json").stat().st_mode) == 0o600  # still private
    claim_run_dir(_cfg(tmp_path, script))  # the new content is the run's now
