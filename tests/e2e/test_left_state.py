"""The plain loop idiom (``for step in session.loop(...)`` with DDP built before it, no
``Session.run``) on real processes, 4 ranks on gloo: a rank SIGKILLed mid-run, or a rank that hangs
mid-run (asleep in the chaos plan's hook, outside the collective its peers wait in: the agent tells it
from them by their stacks and kills it first, so their collectives fail instead of their being killed
in them). The survivors' processes end with the broken group, so the whole group restarts warm; the
survivors leave their live state in the node's memory on the way out and the restarted group takes it
(train/left_state.py): nothing is rolled back to the checkpoint, the data position and every rank's
random stream are kept, and the run ends bit-identical to an uninterrupted one, having seen the same
samples at the same steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.account.recovery import recoveries
from stalwart.events import (
    LEFT_IN_MEMORY,
    DecisionTaken,
    FailureDetected,
    StackCaptured,
    StepCompleted,
    TrainingResumed,
    WorkersStopped,
)

from .runner import events, same_params, stalwart

pytestmark = pytest.mark.e2e
SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "inplace_ddp.py")
STEPS, RANKS, CRASH = 30, 4, 17  # a checkpoint every 10 steps: the newest before the crash is step 10


def _run(tmp: Path, monkeypatch: pytest.MonkeyPatch, *extra: str, idiom: str = "loop") -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("INPLACE_IDIOM", idiom)
    monkeypatch.setenv("INPLACE_DATA", "1")
    args = ["run", "-q", "--nproc-per-node", str(RANKS), "--run-dir", str(tmp / "run"), *extra]
    res = stalwart(*args, SCRIPT, str(STEPS), str(tmp), timeout=420)
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]


def _seen(tmp: Path, rank: int) -> dict[int, str]:
    """Step -> the sample index rank ``rank`` took at it, the last time it ran that step."""
    out = {}
    for line in (tmp / f"seen-rank{rank}.txt").read_text().splitlines():
        _, step, index = line.split()
        out[int(step)] = index
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run both faults are compared with."""
    base = tmp_path_factory.mktemp("left") / "baseline"
    with pytest.MonkeyPatch.context() as mp:
        _run(base, mp)
    return base


@pytest.mark.parametrize("idiom", ["loop", "own"])
@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_the_loop_idioms_survivors_leave_their_state_and_nothing_is_rolled_back(
    tmp_path, monkeypatch, baseline, fault, idiom
):
    """``own``: the script's own loop and step counter (``session.track``), against the same
    baseline run by ``session.loop``: the two ways of driving the steps train alike."""
    base, hit = baseline, tmp_path / "hit"
    _run(hit, monkeypatch, "--chaos", f"{fault}@rank=2,step={CRASH}", idiom=idiom)
    run = hit / "run"
    [failure] = events(run, FailureDetected)
    assert failure.rank == 2, failure  # the hung rank, not a peer waiting for it
    resumed = {e.attempt: e for e in events(run, TrainingResumed)}
    assert set(resumed) == {0, 1}, resumed  # one whole-group restart
    again = resumed[1]
    # how attempt 0 ended, for a failure's message: the stop (hung rank first or all at once) and why,
    # which ranks answered for their stacks, and everything recorded from the failure on
    ended = [
        f"{type(e).__name__} (rank {e.rank}): {e.reason}"
        for e in events(run)
        if isinstance(e, (WorkersStopped, DecisionTaken, StackCaptured)) and e.attempt == 0
    ] + [repr(e)[:300] for e in events(run) if e.ts >= failure.ts and not isinstance(e, StackCaptured)]
    assert again.step == CRASH, (again, ended)  # the interrupted step is redone, nothing before it
    assert again.from_checkpoint.startswith("live:rank") and again.from_checkpoint.endswith(LEFT_IN_MEMORY)
    first = min(e.step for e in events(run, StepCompleted) if e.attempt == 1)
    assert first == CRASH
    [rec] = recoveries(events(run))
    assert rec.path == "warm" and "left in node memory" in rec.why, rec
    assert same_params(hit / "final.pt", base / "final.pt"), "the left state changed the result"
    for r in range(RANKS):
        assert _seen(hit, r) == _seen(base, r), f"rank {r} took other samples after the restart"
        pids = [int(x) for x in (hit / f"pids-rank{r}.txt").read_text().split()]
        assert len(pids) == 2 and pids[0] != pids[1], pids  # every process restarted: not in place
