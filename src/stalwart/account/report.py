"""``stalwart report``: goodput, badput buckets, interruptions and reliability of one run."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

from ..diagnose.straggler import score_ranks, slow_spans
from ..events import StepCompleted
from ..ledger import read_available
from .goodput import BUCKETS, compute
from .reliability import interruptions_from_events, mtbf, mttr


def build(location: str | os.PathLike[str]) -> dict[str, Any]:
    """The report as plain data: what ``--json`` prints and what the library returns."""
    read = read_available(location)
    events = read.events
    gp = compute(events)
    rel = interruptions_from_events(events)
    rep_mttr = mttr(rel.interruptions)
    n = len(rel.interruptions)
    steps = [e for e in events if isinstance(e, StepCompleted)]
    stragglers = score_ranks(steps)
    spans = slow_spans(steps)
    return {
        "run_dir": str(location),
        "outcome": gp.outcome,
        "verdict": gp.verdict,
        "exit_code": gp.exit_code,
        "wall_s": gp.wall_s,
        "goodput": gp.goodput,
        "steps_completed": gp.steps_completed,
        "ideal_step_s": gp.ideal_step_s,
        "buckets_s": {b: gp.buckets[b] for b in BUCKETS},
        "interruptions": [asdict(c) for c in gp.interruptions],
        "reliability": {
            "failures": n,
            "mtbf_job_hours": mtbf(n, rel.exposure, "job_hours").value,
            "mtbf_gpu_hours": mtbf(n, rel.exposure, "gpu_hours").value,
            "mttr_s": asdict(rep_mttr),
            "exposure": asdict(rel.exposure),
        },
        "stragglers": {
            "reason": stragglers.reason,
            "ranks": [asdict(r) for r in stragglers.ranks],
            "spans": [asdict(sp) for sp in spans],
        },
        "skipped": [{"path": str(sk.path), "reason": sk.reason, "rows": sk.rows} for sk in read.skipped],
    }


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}s" if x < 120 else f"{x / 60:.1f}m"


def render(rep: dict[str, Any], console=None) -> None:
    from rich.console import Console
    from rich.markup import escape as esc
    from rich.table import Table

    con = console or Console()
    wall = rep["wall_s"]
    con.print(f"[bold]Run report[/] {esc(rep['run_dir'])}")
    con.print(f"outcome: {rep['outcome']} (exit {rep['exit_code']}): {esc(rep['verdict'])}")
    con.print(
        f"wall {_fmt_s(wall)}, {rep['steps_completed']} steps, ideal step {rep['ideal_step_s'] * 1e3:.1f} ms, "
        f"[bold]goodput {100 * rep['goodput']:.1f}%[/]"
    )
    t = Table(title="Where the wall time went", show_lines=False)
    t.add_column("bucket")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    for name, secs in rep["buckets_s"].items():
        if secs > 0 or name == "productive":
            t.add_row(name.replace("_", " "), _fmt_s(secs), f"{100 * secs / wall:.1f}%" if wall else "-")
    t.add_row("[bold]total[/]", _fmt_s(sum(rep["buckets_s"].values())), "100.0%")
    con.print(t)
    if rep["interruptions"]:
        it = Table(title="Interruptions")
        for col in ("#", "failure", "rank", "step", "detect", "lost work", "recovery", "total cost"):
            it.add_column(col, justify="right" if col not in ("failure",) else "left")
        for i, c in enumerate(rep["interruptions"], 1):
            it.add_row(
                str(i),
                c["failure"],
                str(c["rank"]),
                str(c["step"]),
                _fmt_s(c["detection_s"]),
                _fmt_s(c["lost_work_s"]),
                _fmt_s(c["recovery_s"]),
                _fmt_s(c["total_s"]),
            )
        con.print(it)
    r = rep["reliability"]
    m = r["mttr_s"]
    mtbf_h = r["mtbf_job_hours"]
    con.print(
        f"failures {r['failures']}; MTBF {f'{mtbf_h:.4f} job-hours' if mtbf_h else 'n/a (no failures)'}"
        f" ({(r['mtbf_gpu_hours'] or 0):.4f} GPU-hours); MTTR {_fmt_s(m['total_s'])} = detect "
        f"{_fmt_s(m['detect_s'])} + decide {_fmt_s(m['decide_s'])} + recover {_fmt_s(m['recover_s'])}"
    )
    for sk in rep.get("skipped", ()):
        what = f"{sk['rows']} row(s) of" if sk["rows"] else "ledger"
        con.print(f"[yellow]skipped {what} {esc(sk['path'])}: {esc(sk['reason'])}[/]")
    con.print(f"stragglers over the whole run: {esc(rep['stragglers']['reason'])}")
    for sp in rep["stragglers"]["spans"]:
        con.print(
            f"  rank {sp['rank']} was a straggler in steps {sp['first_step']}-{sp['last_step']} "
            f"(up to {sp['score']:.2f}x the fleet median own-work time)"
        )


def print_report(location: str | os.PathLike[str], *, as_json: bool = False) -> dict[str, Any]:
    rep = build(location)
    if as_json:
        print(json.dumps(rep, indent=1, default=str))
    else:
        render(rep)
    return rep
