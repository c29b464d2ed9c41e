"""The report shows what the live console showed: stragglers from the ledger's StragglerDetected and
StragglerCleared events (every flagged rank, its own score), and every rejected checkpoint."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console
from test_goodput import RUN, crash_run  # tests/unit is on sys.path (rootdir import mode)

from stalwart.account.report import build, notes, render
from stalwart.diagnose.straggler_episodes import episodes
from stalwart.events import CheckpointRejected, FailureDetected, StragglerCleared, StragglerDetected
from stalwart.launch.console import RunConsole
from stalwart.ledger import LedgerWriter
from widths import unwrap


def live_events() -> list:
    ctx = {"run_id": RUN, "node": "n0", "attempt": 0}
    return [
        StragglerDetected(ts=5.1, rank=3, score=2.31, step=4, evidence="rank 3 spends ... 2.31x", **ctx),
        StragglerDetected(ts=5.1, rank=0, score=1.27, step=4, evidence="rank 3 spends ... 2.31x", **ctx),
        StragglerCleared(ts=6.1, rank=0, score=1.02, step=6, **ctx),
        CheckpointRejected(
            ts=12.2,
            run_id=RUN,
            node="n0",
            attempt=1,
            rank=0,
            path="/r/ckpt/step-5",
            reason="checksum mismatch in shard 0",
            step=5,
        ),
    ]


def test_episodes_pair_detected_and_cleared_per_rank():
    eps = episodes(live_events())
    assert [(e.rank, e.first_step, e.last_step, e.score) for e in eps] == [
        (0, 4, 6, 1.27),
        (3, 4, None, 2.31),
    ]


def test_report_lists_what_the_console_printed(tmp_path):
    evs = crash_run() + live_events()
    w = LedgerWriter(tmp_path / "agent.ledger", writer="test")
    for ev in sorted(evs, key=lambda e: e.ts):
        w.append(ev)
    w.close()
    rep = build(tmp_path)
    assert [(s["rank"], s["score"]) for s in rep["stragglers"]["spans"]] == [(0, 1.27), (3, 2.31)]
    assert [r["reason"] for r in rep["checkpoints_rejected"]] == ["checksum mismatch in shard 0"]

    out = io.StringIO()
    render(rep, Console(file=out, width=80, highlight=False))
    text = " ".join(out.getvalue().split())  # prose wraps at 80 columns: read it back as one line
    live = io.StringIO()
    con = RunConsole(stream=live)
    for ev in live_events()[:2]:
        con.event(ev)
    # the same ranks and the same scores, each rank with its own score
    assert "rank 3 at step 4: 2.31x" in live.getvalue() and "rank 0 at step 4: 1.27x" in live.getvalue()
    assert "rank 3 (attempt 0): 2.31x" in text and "rank 0 (attempt 0): 1.27x" in text
    assert "cleared at step 6" in text and "still slow" in text
    assert "no rank above" not in text
    assert "checksum mismatch in shard 0" in text and "/r/ckpt/step-5" in text


def test_note_says_when_start_up_dominates():
    assert notes({"startup": 50.0, "restart": 20.0, "productive": 30.0}, 100.0, 4)[0].startswith(
        "70% of the wall"
    )
    assert notes({"startup": 5.0, "restart": 5.0, "productive": 90.0}, 100.0, 4) == []


def test_report_lists_each_incident_as_the_console_printed_it_and_the_detector_table(tmp_path):
    from stalwart.events import ChaosInjected, IncidentRaised

    ctx = {"run_id": RUN, "node": "n0", "attempt": 0}
    inc = IncidentRaised(
        ts=7.0,
        onset=6.5,
        cause="cooling seam: loop loopA is failing (inlet 24.0 -> 31.0 C)",
        fault_class="facility",
        component="cooling",
        confidence=0.8,
        action="facility_alert_no_rma",
        rule="seam:cooling-loop",
        evidence=("cooling loop loopA degraded: inlet 24.0 -> 31.0 C",),
        nodes=("n0", "n1"),
        ranks=(3,),
        domain="cooling_loop:loopA",
        cost_gpu_s=7200.0,
        **ctx,
    )
    chaos = ChaosInjected(ts=4.0, rank=3, fault="slow", detail="slow rank 3 x2", **ctx)
    evs = sorted([*crash_run(), *live_events(), chaos, inc], key=lambda e: e.ts)
    with LedgerWriter(tmp_path / "agent.ledger", writer="test") as w:
        for ev in evs:
            w.append(ev)
    rep = build(tmp_path)
    [row] = rep["incidents"]
    assert (row["class"], row["component"], row["action"], row["cost_gpu_s"]) == (
        "facility",
        "cooling",
        "facility_alert_no_rma",
        7200.0,
    )
    assert row["blast_radius"]["domain"] == "cooling_loop:loopA"
    straggler = next(d for d in rep["detectors"] if d["detector"] == "straggler")
    # rank 3's firing follows the chaos fault on rank 3; rank 0's follows nothing
    assert (straggler["firings"], straggler["confirmed"], straggler["faults"], straggler["caught"]) == (
        2,
        1,
        1,
        1,
    )

    live = io.StringIO()
    RunConsole(stream=live).event(inc)
    out = io.StringIO()
    render(rep, Console(file=out, width=300, highlight=False))
    printed = unwrap(live.getvalue()).split("incident: ", 1)[1].strip()
    assert printed in out.getvalue().replace("\n", " ")  # the report repeats the console's line
    assert "2.000 GPU-h" in printed and "blast radius cooling_loop:loopA (ranks 3)" in printed
    table = out.getvalue().split("Detector precision", 1)[1]
    assert any(ln.split()[:3] == ["straggler", "2", "1"] for ln in table.splitlines() if "straggler" in ln)
    assert "50%" in table
    # the mode column says what it gates: a detector shown 'observe' still had its crashes recovered
    assert "crashes and hangs are recovered in either mode" in unwrap(table, 300)


def test_no_step_observed_says_productive_time_is_unknown_not_zero():
    (note,) = notes({"startup": 5.0, "productive": 0.0, "other": 95.0}, 100.0, 0)
    assert note.startswith("productive time unknown") and "--no-instrument" in note
    assert not any(n.startswith("productive time unknown") for n in notes({"productive": 90.0}, 100.0, 2))


def test_an_unknown_step_reads_as_a_dash_not_minus_one(tmp_path):
    """A failure before the first step, or of a script without the SDK, has no step (-1 in the
    ledger); the report's table shows "-" there."""
    evs = [dataclasses.replace(e, step=-1) if isinstance(e, FailureDetected) else e for e in crash_run()]
    with LedgerWriter(tmp_path / "agent.ledger", writer="test") as w:
        w.extend(sorted(evs, key=lambda e: e.ts))
    out = io.StringIO()
    render(build(tmp_path), Console(file=out, width=100, highlight=False))
    (row,) = [ln for ln in out.getvalue().splitlines() if ln.startswith("│ 1 │ crash")]
    assert [c.strip() for c in row.split("│")][5] == "-", row
