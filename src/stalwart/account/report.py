"""``stalwart report``: goodput, badput buckets, interruptions and reliability of one run."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.markup import escape as esc

from ..diagnose.incident import event_line
from ..diagnose.precision import detector_stats, precision_gate
from ..diagnose.straggler_episodes import episodes
from ..events import ChaosUnfired, CheckpointRejected, IncidentRaised, StepCompleted, TrainingResumed
from ..events.checkpoint import CheckpointDamaged, CheckpointIntervalAdvised, CheckpointsVerified
from ..ledger import read_available
from ..protocol.step_history import ResumeSource, script_resume
from ..terminal import clock, plural
from ..terminal import console as terminal_console
from ..terminal import say as wrapped
from .goodput import BUCKETS, compute
from .hosts import host_views
from .reliability import interruptions_from_events, mtbf, mttr
from .startup import line as startup_line
from .startup import startups
from .world_changes import lines as world_change_lines
from .world_changes import world_changes

if TYPE_CHECKING:
    from rich.console import Console


# Any: the report is a JSON document of any shape (json.dumps)
def build(location: str | os.PathLike[str]) -> dict[str, Any]:
    """The report as plain data: what ``--json`` prints and what the library returns."""
    read = read_available(location)
    events = read.events
    gp = compute(events)
    rel = gp.reliability or interruptions_from_events(events)
    rep_mttr = mttr(rel.interruptions)
    n = len(rel.interruptions)
    steps = [e for e in events if isinstance(e, StepCompleted)]
    # one source with the live console: the agent's StragglerDetected/StragglerCleared events
    found = episodes(events)
    rejected = [e for e in events if isinstance(e, CheckpointRejected)]
    incidents = sorted((e for e in events if isinstance(e, IncidentRaised)), key=lambda e: e.ts)
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
        "recoveries": [dict(asdict(r), total_s=r.total_s) for r in rel.recovered],
        "startup": [{"node": s.node, "phases": s.phases, "total_s": s.total_s} for s in startups(events)],
        "jobs": gp.jobs,
        "preemptions": list(gp.preemptions),
        "hosts": _hosts(events),
        "world_changes": _world_changes(events),
        "reliability": {
            "failures": n,
            "mtbf_job_hours": mtbf(n, rel.exposure, "job_hours").value,
            "mtbf_gpu_hours": mtbf(n, rel.exposure, "gpu_hours").value,
            "mttr_s": asdict(rep_mttr),
            "exposure": asdict(rel.exposure),
        },
        "stragglers": {
            "source": "StragglerDetected/StragglerCleared events (what the live console showed)",
            "spans": [asdict(ep) for ep in found],
        },
        "checkpoint_interval": [  # --checkpoint-every auto: the interval over time
            {"ts": e.ts, "attempt": e.attempt, "interval_steps": e.interval_steps, "reason": e.reason}
            for e in events
            if isinstance(e, CheckpointIntervalAdvised) and e.applied
        ],
        # an unchanged script's own resume points: its step numbers and lost work follow from them
        "script_resumes": [
            {"attempt": e.attempt, "step": e.step, "how": e.from_checkpoint.removeprefix("script:")}
            for e in events
            if isinstance(e, TrainingResumed) and script_resume(e.from_checkpoint) is not None
        ],
        "checkpoints_rejected": [
            {
                "ts": e.ts,
                "path": e.path,
                "reason": e.reason,
                "step": e.step,
                "rank": e.rank,
                "attempt": e.attempt,
            }
            for e in rejected
        ],
        "checkpoints_damaged": [  # found by background verification and set aside before any load
            {
                "ts": e.ts,
                "path": e.path,
                "tier": e.tier,
                "step": e.step,
                "reason": e.reason,
                "set_aside": e.set_aside,
                "fallback": e.fallback,
            }
            for e in events
            if isinstance(e, CheckpointDamaged)
        ],
        "checkpoint_verification": [  # its cost, per node (launch/checkpoint_scrub.py)
            {
                "node": e.node,
                "readings": e.readings,
                "bytes": e.bytes,
                "cpu_s": e.cpu_s,
                "share": e.cpu_s / gp.wall_s if gp.wall_s > 0 else None,
                "damaged": e.damaged,
                "duty": e.duty,
            }
            for e in events
            if isinstance(e, CheckpointsVerified)
        ],
        "incidents": [
            {
                "ts": e.ts,
                "line": event_line(e),  # what the live console printed
                "cause": e.cause,
                "class": e.fault_class,
                "component": e.component,
                "confidence": e.confidence,
                "evidence": list(e.evidence),
                "action": e.action,
                "action_taken": e.action_taken,
                "blast_radius": {"nodes": list(e.nodes), "ranks": list(e.ranks), "domain": e.domain},
                "cost_gpu_s": e.cost_gpu_s,
                "rule": e.rule,
                "node": e.node,
            }
            for e in incidents
        ],
        "detectors": [
            {**asdict(d), "precision": d.precision, "recall": d.recall, "mode": precision_gate(d).mode}
            for d in detector_stats(events)
        ],
        "chaos_unfired": [f for e in events if isinstance(e, ChaosUnfired) for f in e.faults],
        "chaos_unfired_lines": [e.line for e in events if isinstance(e, ChaosUnfired)],
        "notes": notes(gp.buckets, gp.wall_s, len({s.rank for s in steps})),
        "skipped": [{"path": str(sk.path), "reason": sk.reason, "rows": sk.rows} for sk in read.skipped],
    }


def _world_changes(events) -> dict[str, Any]:  # Any: the report is a JSON document of any shape (json.dumps)
    """Changes of world size in place and the steps trained below the launched size
    (account/world_changes.py): an account beside goodput, which counts those steps as productive."""
    found = world_changes(events)
    return {
        "changes": [asdict(c) for c in found.changes],
        "periods": [
            dict(asdict(p), forgone_step_equivalents=round(p.forgone_step_equivalents, 3))
            for p in found.periods
        ],
        "summary": found.summary(),
    }


def _hosts(events) -> list[dict[str, Any]]:  # Any: the report is a JSON document of any shape (json.dumps)
    """Each host's own view (account/hosts.py), for a run of more than one host."""
    views = host_views(events)
    if len(views) < 2:
        return []
    return [
        {"node": v.node, "line": v.line(), "steps": v.steps, "trained_s": v.trained_s, **asdict(v)}
        for v in views
    ]


def notes(buckets: dict[str, float], wall_s: float, ranks: int) -> list[str]:
    """Plain-language notes that keep the goodput figure honest (pure)."""
    out = []
    if wall_s > 0 and ranks == 0:  # zero (issue 25): no step observed is not 0% productive
        out.append(
            "productive time unknown: no step was observed (the script does not use the SDK and no "
            "torch optimizer step hook fired: it steps no torch optimizer, or ran with --no-instrument); "
            "the goodput figure is not measured, it is not zero progress"
        )
    if wall_s > 0:
        spin = buckets.get("startup", 0.0) + buckets.get("restart", 0.0)
        if spin / wall_s >= 0.3:
            out.append(
                f"{100 * spin / wall_s:.0f}% of the wall time is start-up and restarts (starting Python, "
                "importing torch, forming the process group, once per attempt); it does not grow with "
                "the run's length, so on a short run on a few CPU cores it dominates goodput, and on a "
                "long run it is amortised"
            )
    return out


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}s" if x < 120 else f"{x / 60:.1f}m"


# Any: the report is a JSON document of any shape (json.dumps)
def render(rep: dict[str, Any], console: Console | None = None) -> None:
    con = console or terminal_console()

    def say(text: str) -> None:  # prose wrapped at words to the width, later lines indented
        wrapped(con, text)

    _render_summary(rep, con, say)
    _render_buckets(rep, con)
    for s in rep.get("startup") or ():  # the start-up bucket, split (account/startup.py)
        say(f"{esc(s['node'])}: {esc(startup_line(s['phases']))}")
    if rep.get("hosts"):
        say("what each host saw (the table above is the merged account of all of them):")
        for h in rep["hosts"]:
            say(f"  {esc(h['line'])}")
    _render_interruptions(rep["interruptions"], con)
    _render_recoveries(rep.get("recoveries", []), con)
    for line in world_change_lines(rep.get("world_changes") or {}):
        say(esc(line))
    _render_reliability(rep, say)
    _render_findings(rep, con, say)
    _render_detectors(rep.get("detectors") or [], con, say)
    for line in rep.get("chaos_unfired_lines") or ():
        say(esc(line))
    for n in rep["notes"]:
        say(f"note: {esc(n)}")


# Any: the report is a JSON document of any shape (json.dumps)
def _render_summary(rep: dict[str, Any], con: Console, say: Callable[[str], None]) -> None:
    say(f"[bold]Run report[/] {esc(rep['run_dir'])}")
    say(f"outcome: {rep['outcome']} (exit {rep['exit_code']}): {esc(rep['verdict'])}")
    say(
        f"wall {_fmt_s(rep['wall_s'])}, {plural(rep['steps_completed'], 'step')}, "
        f"ideal step {rep['ideal_step_s'] * 1e3:.1f} ms, [bold]goodput "
        + (f"{100 * rep['goodput']:.1f}%" if rep["steps_completed"] or not rep["wall_s"] else "unknown")
        + "[/]"
    )
    if rep["jobs"] > 1 or rep["preemptions"]:
        when = ", ".join(clock(t) for t in rep["preemptions"]) or "none"
        say(
            f"{plural(rep['jobs'], 'job')} in this run; preempted at {when}; queue between jobs "
            f"{_fmt_s(rep['buckets_s']['queue'])} (not productive)"
        )


# Any: the report is a JSON document of any shape (json.dumps)
def _render_buckets(rep: dict[str, Any], con: Console) -> None:
    from rich.table import Table  # deferred: heavy (rich)

    wall = rep["wall_s"]
    t = Table(title="Where the wall time went", show_lines=False)
    t.add_column("bucket")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    for name, secs in rep["buckets_s"].items():
        if secs > 0 or name == "productive":
            t.add_row(name.replace("_", " "), _fmt_s(secs), f"{100 * secs / wall:.1f}%" if wall else "-")
    t.add_row("[bold]total[/]", _fmt_s(sum(rep["buckets_s"].values())), "100.0%")
    con.print(t)


# Any: the report is a JSON document of any shape (json.dumps)
def _render_interruptions(interruptions: list[dict[str, Any]], con: Console) -> None:
    from rich.table import Table  # deferred: heavy (rich)

    if not interruptions:
        return
    it = Table(title="Interruptions")
    for col in ("#", "failure", "host", "rank", "step", "detect", "lost work", "recovery", "total cost"):
        # a long host name folds onto a second line rather than being cut ("node-wi…")
        it.add_column(col, justify="right" if col not in ("failure", "host") else "left", overflow="fold")
    for i, c in enumerate(interruptions, 1):
        it.add_row(
            str(i),
            c["failure"],
            c["node"] or "-",
            str(c["rank"]),
            str(c["step"]) if c["step"] >= 0 else "-",  # -1: not known (no SDK, before a first step)
            _fmt_s(c["detection_s"]),
            _fmt_s(c["lost_work_s"]),
            _fmt_s(c["recovery_s"]),
            _fmt_s(c["total_s"]),
        )
    con.print(it)


# Any: the report is a JSON document of any shape (json.dumps)
def _render_reliability(rep: dict[str, Any], say: Callable[[str], None]) -> None:
    r = rep["reliability"]
    m = r["mttr_s"]
    mtbf_h = r["mtbf_job_hours"]
    if not r["failures"]:
        say("failures: none")
    else:
        say(
            f"failures {r['failures']}; MTBF {f'{mtbf_h:.4f} job-hours' if mtbf_h else 'n/a'}"
            f" ({(r['mtbf_gpu_hours'] or 0):.4f} GPU-hours); MTTR {_fmt_s(m['total_s'])} = detect "
            f"{_fmt_s(m['detect_s'])} + decide {_fmt_s(m['decide_s'])} + recover {_fmt_s(m['recover_s'])}"
        )
    for sk in rep.get("skipped", ()):
        what = f"{plural(sk['rows'], 'row')} of" if sk["rows"] else "ledger"
        say(f"[yellow]skipped {what} {esc(sk['path'])}: {esc(sk['reason'])}[/]")


# Any: the report is a JSON document of any shape (json.dumps)
def _render_findings(rep: dict[str, Any], con: Console, say: Callable[[str], None]) -> None:
    """Stragglers, rejected checkpoints and incidents, one line each."""
    spans = rep["stragglers"]["spans"]
    say(f"stragglers (as detected live): {len(spans) or 'none'}")
    for sp in spans:
        until = (
            f"cleared at step {sp['last_step']} ({sp['cleared_score']:.2f}x)"
            if sp["last_step"] is not None
            else "still slow at the end of the attempt"
        )
        say(
            f"  rank {sp['rank']} (attempt {sp['attempt']}): {sp['score']:.2f}x the fleet median own-work "
            f"time from step {sp['first_step']}; {until}"
        )
    changes = rep.get("checkpoint_interval", [])
    if changes:
        steps = " -> ".join(f"{c['interval_steps']} ({clock(c['ts'])})" for c in changes)
        say(f"checkpoint interval (auto), steps over time: {steps}")
        say(f"  [dim]{esc(changes[-1]['reason'])}[/]")
    for r in rep.get("script_resumes", []):
        told = script_resume(f"script:{r['how']}")
        if told is None:
            continue
        source, how = told
        if source is ResumeSource.UNKNOWN:
            say(
                f"attempt {r['attempt']}: where the script resumed is not known ({esc(how)}); its steps are counted from 0"
            )
        else:
            say(
                f"attempt {r['attempt']}: the script {esc(how)} (its own checkpoint, told by {source.name.lower().replace('_', ' ')})"
            )
    rejected = rep["checkpoints_rejected"]
    say(f"checkpoints rejected on load: {len(rejected) or 'none'}")
    for r in rejected:
        step = f"step {r['step']}, " if r["step"] >= 0 else ""
        say(f"  {esc(r['path'])} ({step}attempt {r['attempt']}): {esc(r['reason'])}")
    for v in rep.get("checkpoint_verification", []):
        share = f" ({100 * v['share']:.1f}% of one CPU over the run)" if v["share"] is not None else ""
        say(
            f"background checkpoint verification on {esc(v['node'])}: {plural(v['readings'], 'version')} "
            f"read ({v['bytes'] / 1e6:.1f} MB) in {v['cpu_s']:.2f}s of CPU{share}"
        )
    damaged = rep.get("checkpoints_damaged", [])
    if damaged or rep.get("checkpoint_verification"):  # said only where it ran
        say(f"checkpoints found damaged in the background and set aside: {len(damaged) or 'none'}")
    for d in damaged:
        say(
            f"  {clock(d['ts'])} {esc(d['tier'])} tier, step {d['step']}: {esc(d['reason'])}; {esc(d['fallback'])}"
        )
    incidents = rep.get("incidents", [])
    say(f"incidents: {len(incidents) or 'none'}")
    for inc in incidents:
        wrapped(con, f"  {clock(inc['ts'])} {esc(inc['line'])}", hang=9)  # under the text, past the time
        for line in inc["evidence"][:4]:
            say(f"    [dim]{esc(line)}[/]")


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f}%"


# Any: the report is a JSON document of any shape (json.dumps)
def _render_detectors(dets: list[dict[str, Any]], con: Console, say: Callable[[str], None]) -> None:
    from rich.table import Table  # deferred: heavy (rich)

    if not dets:
        return
    if not any(d["faults"] or d["confirmed"] for d in dets):
        # nothing to join the firings with (no injected faults, no confirming evidence): a table of
        # 0% would call real faults false alarms
        fired = ", ".join(f"{d['detector']} {d['firings']}" for d in dets)
        say(f"detector firings: {fired} (no ground truth in this run to measure precision against)")
        return
    from rich import box  # deferred: heavy (rich)

    # no vertical rules, one space of padding between columns: 8 columns fit 80 uncut ("confi…")
    dt = Table(
        title="Detector precision (firings joined with what followed)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    dt.add_column("detector", no_wrap=True)
    for col in ("fired", "confirmed", "prec.", "faults", "caught", "recall"):
        dt.add_column(col, justify="right")
    dt.add_column("mode")
    for d in dets:
        dt.add_row(
            d["detector"],
            str(d["firings"]),
            str(d["confirmed"]),
            _pct(d["precision"]),
            str(d["faults"]),
            str(d["caught"]),
            _pct(d["recall"]),
            d["mode"],
        )
    con.print(dt)
    say(
        "mode: whether a detector's discretionary actions (excluding or draining a node) are taken "
        "(act) or only recorded (observe) until its precision is proven; crashes and hangs are "
        "recovered in either mode"
    )


# Any: the report is a JSON document of any shape (json.dumps)
def _render_recoveries(recs: list[dict[str, Any]], con: Console) -> None:
    """Each interruption's recovery path (warm / cold and why) and its phases (account/recovery.py)."""
    from rich.table import Table  # deferred: heavy (rich)

    if not recs:
        return
    t = Table(title="Recoveries (fault onset -> first step of the new attempt)")
    for col in ("#", "path", "detect", "tear down", "decide", "re-form", "load", "first step", "total"):
        t.add_column(col, justify="left" if col == "path" else "right", no_wrap=col == "path")
    for i, r in enumerate(recs, 1):
        ph = r["phases"]
        t.add_row(str(i), r["path"] or "-", *(_fmt_s(ph[k]) for k in ph), _fmt_s(r["total_s"]))
    con.print(t)
    for i, r in enumerate(recs, 1):
        if r["why"] and (r["path"] != "warm" or "in-place" in r["why"]):
            wrapped(con, f"  recovery {i} ({r['path']}): {esc(r['why'])}")


# Any: the report is a JSON document of any shape (json.dumps)
def print_report(location: str | os.PathLike[str], *, as_json: bool = False) -> dict[str, Any]:
    rep = build(location)
    if as_json:
        print(json.dumps(rep, indent=1, default=str))
    else:
        render(rep)
    return rep
