"""Where the start-up went (account/startup.py): the phases between the agent's marks, the report's
split per node, and the live console's line from the same events."""

from __future__ import annotations

import pytest

from stalwart.account.startup import PHASES, StartupWatch, line, split, startups
from stalwart.events import AttemptStarted, DecisionTaken, JobStarted, StepCompleted
from stalwart.events.startup import StartupMarks

T = 1_800_000_000.0


def _node(node: str, t: float, *, marks: bool = True, steps: bool = True) -> list:
    ctx = {"run_id": "r", "node": node}
    evs = [JobStarted(ts=t, script="train.py", **ctx, attempt=0)]
    if marks:
        evs.append(StartupMarks(ts=t + 2.5, imported=t + 2.0, services=t + 2.5, **ctx, attempt=0))
    evs.append(AttemptStarted(ts=t + 4.0, world_size=2, **ctx, attempt=0))
    evs.append(DecisionTaken(ts=t + 5.5, action="start_warm", reason="warm: forked", **ctx, attempt=0))
    if steps:
        evs += [
            StepCompleted(ts=t + 9.0, step=0, start=t + 8.0 + r * 0.1, duration=1.0, rank=r, **ctx, attempt=0)
            for r in (0, 1)
        ]
    return evs


def test_each_phase_runs_from_the_mark_before_and_a_missing_mark_leaves_it_and_the_next_unknown():
    assert split([0.0, 2.0, 2.5, 4.0, 5.5, 8.0]) == dict(zip(PHASES, [2.0, 0.5, 1.5, 1.5, 2.5], strict=True))
    assert split([0.0, None, None, 4.0, 5.5, 8.0]) == {
        "python": None,
        "services": None,
        "rendezvous": None,
        "workers": 1.5,
        "script": 2.5,
    }
    # a mark before the one before it ends its phase at once; the phases still add up to the last mark
    dip = split([0.0, 2.0, 1.0, 4.0, 5.5, 8.0])
    assert dip["services"] == 0.0 and sum(v for v in dip.values() if v is not None) == 8.0
    with pytest.raises(ValueError):
        split([0.0, 1.0])


def test_the_report_splits_each_nodes_first_start_up():
    evs = sorted(_node("n0", T) + _node("n1", T + 1.0, marks=False), key=lambda e: e.ts)
    n0, n1 = startups(evs)
    assert n0.node == "n0" and n0.phases == pytest.approx(
        {"python": 2.0, "services": 0.5, "rendezvous": 1.5, "workers": 1.5, "script": 2.5}
    )
    assert n0.total_s == pytest.approx(8.0)
    # an older agent wrote no marks: the phases it did not see are unknown, not folded into others
    assert n1.phases["python"] is None and n1.phases["rendezvous"] is None and n1.total_s is None
    assert n1.phases["script"] == pytest.approx(2.5)
    # without steps (no SDK) the script's phase is unknown
    (bare,) = startups(_node("n2", T, steps=False))
    assert bare.phases["script"] is None and bare.phases["workers"] == pytest.approx(1.5)


def test_the_console_tells_the_same_split_once_at_the_first_step_of_the_first_attempt():
    evs = _node("n0", T)
    watch = StartupWatch()
    for e in evs:
        if not isinstance(e, StepCompleted):
            watch.seen(e)
    assert watch.first_step(1, T + 8.0) is None  # a step of another attempt: not the start-up
    told = watch.first_step(0, T + 8.0)
    (node,) = startups(evs)
    assert told == line(node.phases)
    assert told.startswith("start-up 8.00s before the first step: Python start and imports 2.00s")
    assert watch.first_step(0, T + 9.0) is None  # once


def test_the_line_says_which_phases_were_not_measured():
    said = line({"python": None, "services": None, "rendezvous": 1.0, "workers": 0.5, "script": None})
    assert said == (
        "start-up 1.50s before the first step: rendezvous 1.00s, starting workers 0.50s (Python start and "
        "imports, node services, script until its first step: not measured)"
    )
    assert line(dict.fromkeys(PHASES)) == "start-up: no phase was measured"
