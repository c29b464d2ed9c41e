"""The reduced-batch account (account/world_changes.py), over hand-built ledgers of three nodes.

n0, n1 and n2 run one rank each at world size 3: steps 0-16 from t=2 to t=19 (one second each).
n2 is lost at t=19; n0 decides to shrink at t=25 and records the re-formation at t=26 (world 2 from
3, first step 17, phases 1.0 s); n0 and n1 train steps 17-39 from t=27 to t=50. In the grown run,
n0 decides at t=50.2 to grow, records it at t=54.5 (world 3 from 2, first step 40, phases 1.5 s), and
all three train steps 40-44 from t=53 to t=58.
"""

from __future__ import annotations

import dataclasses
import io
import json

from rich.console import Console

from stalwart.account.goodput import compute
from stalwart.account.report import build, render
from stalwart.account.world_changes import world_changes
from stalwart.events import (
    AttemptEnded,
    AttemptStarted,
    DecisionTaken,
    Event,
    FailureDetected,
    JobEnded,
    JobStarted,
    ReformedInPlace,
    StepCompleted,
    decode,
    encode,
)
from stalwart.ledger import LedgerWriter

RUN = "wc"


def _ctx(node: str, attempt: int = 0) -> dict:
    return {"run_id": RUN, "node": node, "attempt": attempt}


def _steps(node: str, rank: int, first: int, last: int, t: float) -> list[StepCompleted]:
    return [
        StepCompleted(
            ts=t + (s - first) + 1.0, rank=rank, step=s, start=t + (s - first), duration=1.0, **_ctx(node)
        )
        for s in range(first, last + 1)
    ]


def _shrink(node: str = "n0") -> ReformedInPlace:
    return ReformedInPlace(
        ts=26.0,
        generation=1,
        ranks=(),
        step=17,
        lost_steps=0,
        bytes_moved=0,
        state_bytes=0,
        phases={"join": 0.5, "rendezvous": 0.3, "transfer": 0.2},
        world_size=2,
        shrunk_from=3,
        **_ctx(node),
    )


def _ledgers(grow: bool) -> dict[str, list[Event]]:
    end = 59.0 if grow else 51.0
    nodes: dict[str, list[Event]] = {}
    for rank, node in enumerate(("n0", "n1", "n2")):
        nodes[node] = [
            JobStarted(ts=0.5, script="t.py", **_ctx(node)),
            AttemptStarted(ts=1.0, world_size=3, num_nodes=3, group_rank=rank, **_ctx(node)),
            *_steps(node, rank, 0, 16, 2.0),
        ]
    nodes["n0"] += [
        FailureDetected(
            ts=25.0, failure="agent_lost", evidence="n2 silent", onset=19.0, rank=2, **_ctx("n0")
        ),
        DecisionTaken(ts=25.0, action="shrink_in_place", reason="n2 lost, no spare", **_ctx("n0")),
        _shrink(),
    ]
    nodes["n1"] += [DecisionTaken(ts=25.1, action="joined_in_place", reason="n0 shrank", **_ctx("n1"))]
    for rank, node in enumerate(("n0", "n1")):
        nodes[node] += _steps(node, rank, 17, 39, 27.0)
    if grow:
        nodes["n0"] += [
            DecisionTaken(ts=50.2, action="grow_in_place", reason="n2 returned", **_ctx("n0")),
            ReformedInPlace(  # recorded after the grown group's first step ended (the agent's tick)
                ts=54.5,
                generation=2,
                ranks=(2,),
                step=40,
                lost_steps=0,
                bytes_moved=10,
                state_bytes=10,
                phases={"join": 1.0, "transfer": 0.5},
                world_size=3,
                grown_from=2,
                **_ctx("n0"),
            ),
        ]
        for rank, node in enumerate(("n0", "n1", "n2")):
            nodes[node] += _steps(node, rank, 40, 44, 53.0)
    for node in ("n0", "n1") + (("n2",) if grow else ()):
        nodes[node] += [
            AttemptEnded(ts=end - 0.5, reason="succeeded", **_ctx(node)),
            JobEnded(
                ts=end, verdict="done", outcome="succeeded", exit_code=0, requeue_helps=False, **_ctx(node)
            ),
        ]
    return nodes


def _merged(nodes: dict[str, list[Event]]) -> list[Event]:
    return sorted((e for evs in nodes.values() for e in evs), key=lambda e: e.ts)


def _write(tmp_path, nodes: dict[str, list[Event]]) -> None:
    for node, evs in nodes.items():
        with LedgerWriter(tmp_path / "ledger" / f"agent-{node}-1.ledger", writer=f"agent {node}") as w:
            w.extend(evs)


def _text(rep: dict) -> str:
    out = io.StringIO()
    render(rep, Console(file=out, width=400, highlight=False))
    return out.getvalue()


def test_a_run_that_never_shrank_has_no_world_changes_and_no_section(tmp_path):
    nodes = {
        "n0": [e for e in _ledgers(grow=False)["n0"] if e.ts < 20 or isinstance(e, (JobEnded, AttemptEnded))]
    }
    # an in-place replacement at an unchanged world is not a change of world size
    nodes["n0"].append(
        ReformedInPlace(
            ts=20.0,
            generation=1,
            ranks=(1,),
            step=17,
            lost_steps=0,
            bytes_moved=1,
            state_bytes=1,
            phases={},
            **_ctx("n0"),
        )
    )
    _write(tmp_path, nodes)
    rep = build(tmp_path)
    assert rep["world_changes"] == {
        "changes": [],
        "periods": [],
        "summary": {"reduced_steps": 0, "forgone_step_equivalents": 0.0, "reduced_s": 0.0},
    }
    assert "reduced batch" not in _text(rep) and "Shrank" not in _text(rep)


def test_shrink_then_grow_books_the_steps_between_them_once():
    found = world_changes(_merged(_ledgers(grow=True)))
    assert [(c.kind, c.from_world, c.to_world, c.step, c.node) for c in found.changes] == [
        ("shrink", 3, 2, 17, "n0"),
        ("grow", 2, 3, 40, "n0"),
    ]
    # phases as recorded; pause: step 16 ended at 19, step 17 started at 27; step 39 ended at 50, 40 began at 53
    assert [(c.reform_s, c.pause_s) for c in found.changes] == [(1.0, 8.0), (1.5, 3.0)]
    (p,) = found.periods
    assert (p.world_size, p.full_world, p.steps, p.first_step, p.last_step, p.wall_s, p.ended_by) == (
        2,
        3,
        23,
        17,
        39,
        23.0,
        "grow",
    )
    assert abs(p.forgone_step_equivalents - 23 / 3) < 1e-9
    assert found.summary() == {"reduced_steps": 23, "forgone_step_equivalents": 7.667, "reduced_s": 23.0}


def test_a_shrink_never_grown_runs_to_the_attempts_end():
    found = world_changes(_merged(_ledgers(grow=False)))
    assert [(c.kind, c.step) for c in found.changes] == [("shrink", 17)]
    (p,) = found.periods
    assert (p.world_size, p.steps, p.first_step, p.last_step, p.wall_s, p.ended_by) == (
        2,
        23,
        17,
        39,
        23.0,
        "attempt_end",
    )


def test_two_ledgers_with_the_same_steps_and_the_same_change_count_them_once():
    nodes = _ledgers(grow=False)
    nodes["n1"].append(_shrink("n1"))  # a second record of the same shrink, on another node's ledger
    nodes["n1"] += _steps("n1", 3, 17, 39, 27.0)  # and a second rank on n1 recording the same steps
    found = world_changes(_merged(nodes))
    assert len(found.changes) == 1
    assert found.summary() == {"reduced_steps": 23, "forgone_step_equivalents": 7.667, "reduced_s": 23.0}


def test_the_report_books_it_and_says_it_in_words(tmp_path):
    nodes = _ledgers(grow=True)
    _write(tmp_path, nodes)
    rep = build(tmp_path)
    wc = rep["world_changes"]
    assert wc["summary"] == {"reduced_steps": 23, "forgone_step_equivalents": 7.667, "reduced_s": 23.0}
    assert wc["periods"][0]["forgone_step_equivalents"] == 7.667
    json.dumps(rep, default=str)  # what --json prints
    text = _text(rep)
    assert (
        "Trained at a reduced batch: 23 steps (steps 17-39, 23.0 s) at world 2 of 3 (with a fixed "
        "per-rank batch, a third fewer samples per step; 7.7 full steps' worth of samples not seen)." in text
    )
    assert (
        "Shrank 3->2 at step 17 (training paused 8.0 s); grew 2->3 at step 40 (training paused 3.0 s)."
        in text
    )
    # an extra account: the goodput buckets are those of the same run without it
    assert rep["buckets_s"] == compute(_merged(nodes)).buckets


def test_an_old_ledger_without_the_new_fields_reads_as_before():
    shrink = json.loads(encode(_shrink())[1])
    del shrink["grown_from"]  # written before the field existed
    replaced = {k: v for k, v in shrink.items() if k not in ("world_size", "shrunk_from")}
    replaced["ranks"] = [1]  # an in-place replacement, recorded before the group could shrink
    old = decode("ReformedInPlace", shrink)
    assert isinstance(old, ReformedInPlace) and old.grown_from == 0
    evs = [e for e in _merged(_ledgers(grow=False)) if not isinstance(e, ReformedInPlace)]
    found = world_changes([*evs, old])
    assert found.summary() == {"reduced_steps": 23, "forgone_step_equivalents": 7.667, "reduced_s": 23.0}
    older = decode("ReformedInPlace", replaced)
    assert isinstance(older, ReformedInPlace)
    assert world_changes([*evs, older]).changes == ()


def test_without_the_decision_the_shrink_begins_where_its_phases_say():
    # recorded after the first step at world 2 ended (t=28): it began 3.0 s of phases before
    late = dataclasses.replace(_shrink(), ts=28.5, phases={"join": 2.5, "rendezvous": 0.3, "transfer": 0.2})
    evs = [
        late if isinstance(e, ReformedInPlace) else e
        for e in _merged(_ledgers(grow=False))
        if not isinstance(e, (DecisionTaken, AttemptStarted))
    ]
    (c,) = world_changes(evs).changes
    assert (c.from_world, c.to_world, c.reform_s, c.pause_s) == (3, 2, 3.0, 8.0)
    (p,) = world_changes(evs).periods
    assert (p.full_world, p.steps) == (3, 23)  # the launched size from the shrink itself


def test_a_survivors_step_before_the_shrink_recorded_after_it_began_is_not_a_reduced_step():
    """CI run 21: a survivor completed the step before the shrink's after the shrink began (its step did
    not need the lost node); that step ran at the old size."""
    ledgers = _ledgers(grow=True)
    late = StepCompleted(ts=25.9, rank=2, step=16, start=25.0, duration=0.9, **_ctx("n2"))
    (p,) = world_changes(_merged({**ledgers, "n2": [*ledgers["n2"], late]})).periods
    assert (p.steps, p.first_step, p.last_step) == (23, 17, 39), p
