"""``stalwart plan``'s tables: the measured run, the plan, the options by size, and the recovery
phases at the plan's size with where each figure came from."""

from __future__ import annotations

from ..terminal import console
from ..terminal import say as wrapped


def compact(x: float) -> str:
    """A count short enough for an 80-column table: 99,999 as is, then 123k, 4.5M, 1.2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M")):
        if abs(x) >= scale:
            return f"{x / scale:,.1f}{suffix}"
    return f"{x / 1e3:.0f}k" if abs(x) >= 1e5 else f"{x:,.0f}"


SHOWN = ("cold", "warm", "peer", "in_place", "replica")  # hot_spares and elastic reuse their phases


def _print_phases(c, d: dict, table, say) -> None:
    """The target job, every option's recovery after a node loss phase by phase, and each figure's
    origin (measured at N ranks, fitted law, published, default, derived from the job)."""
    from ..sim.units import duration  # deferred: heavy (numpy)

    rows = d.get("phases") or []
    if not rows:
        return
    for line in d.get("job") or []:
        say(f"target job: {line}")
    cell: dict[tuple[str, str], float] = {}
    order: list[str] = []
    for r in rows:
        if r["option"] in SHOWN and r["when"] in ("node_loss", "rejoin", "checkpoint"):
            key = r["phase"] if r["when"] != "rejoin" else "rejoin " + r["phase"]
            cell[(r["option"], key)] = cell.get((r["option"], key), 0.0) + float(r["seconds"])
            if key not in order:
                order.append(key)
    body = [[k] + [duration(cell[(o, k)]) if (o, k) in cell else "-" for o in SHOWN] for k in order]
    body.append(
        ["total (recovery)"]
        + [
            duration(sum(v for (o2, k), v in cell.items() if o2 == o and k not in ("stall", "persist")))
            for o in SHOWN
        ]
    )
    c.print(table(f"recovery after a node loss at {d['gpus']:,} GPUs", ["phase", *SHOWN], body))
    seen = set()
    say("where each figure came from:")
    for r in rows:
        key = (r["phase"], r["source"], r["note"])
        if key in seen:
            continue
        seen.add(key)
        say(f"  {r['phase']} ({r['option']}): {r['source']}, {r['note']}")


def _sdc_lines(d: dict) -> list[str]:
    """The replica check's advice (sim/sdc.py), when the plan has a target job."""
    return [f"silent data corruption: {d['sdc']['reason']}"] if d.get("sdc") else []


def _print(d: dict) -> None:
    from rich import box  # deferred: heavy (rich)
    from rich.table import Table  # deferred: heavy (rich)

    c = console()

    def say(text: str) -> None:  # prose: wrapped at words to the width, later lines indented
        wrapped(c, text)

    def table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
        # no vertical rules, each column as wide as its widest value: numbers are never cut at 80 columns
        t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        for i, h in enumerate(headers):
            width = max([len(r[i]) for r in rows] + [max(len(x) for x in h.split("\n"))])
            t.add_column(
                h, justify="left" if i == 0 else "right", overflow="fold", min_width=width, no_wrap=True
            )
        for r in rows:
            t.add_row(*r)
        return t

    from ..sim.units import duration, number, percent  # deferred: heavy (numpy)

    m = d.get("measured")
    if m:
        say(
            f"[bold]measured run:[/bold] {m['gpus']:,} GPUs for {duration(m['wall_s'])} "
            f"({number(m['node_hours'])} node-hours{' of training' if m['injected'] else ''}), "
            f"{m['failures']} failures" + (f", {m['injected']} injected by chaos" if m["injected"] else "")
        )
        rows = [
            [
                k["name"],
                str(k["events"]),
                number(k["per_node_hour"]),
                f"{number(k['low'])} - {number(k['high'])}",
                duration(k["detect_s"]),
            ]
            for k in m["classes"]
        ]
        lo, hi = m["per_node_hour_95"]
        rows.append(
            ["all", str(m["failures"]), number(m["per_node_hour"]), f"{number(lo)} - {number(hi)}", ""]
        )
        c.print(
            table(
                "failure rates fitted per node-hour (95% Poisson bounds)",
                ["failure", "count", "per\nnode-h", "95% bounds", "detect"],
                rows,
            )
        )
        paths = m.get("recover_paths") or []
        if paths:
            total = sum(p["count"] for p in paths)
            rows = [
                [p["path"], str(p["count"]), percent(p["count"] / total), duration(p["recover_s"])]
                for p in paths
            ]
            if m["recover_s"] is not None:
                rows.append(["all (mean)", "", "", duration(m["recover_s"])])
            c.print(
                table(
                    "recovery per path (restart decision -> first step)",
                    ["path", "count", "share", "mean"],
                    rows,
                )
            )
        p5, p95 = m["goodput_predicted_p5_p95"]
        auto = m.get("auto_interval")
        if auto:
            say(f"this run's --checkpoint-every auto: {auto['reason']}")
        say(
            f"goodput: measured {percent(m['goodput_measured'])}, simulated from the fitted rates and "
            f"times {percent(m['goodput_predicted'])} (5-95%: {percent(p5)} - {percent(p95)})"
        )
        wall = m["wall_s"] or 1.0
        rows = [
            [b, percent(m["buckets_measured_s"].get(b, 0.0) / wall), percent(v / wall)]
            for b, v in m["buckets_predicted_s"].items()
            if v > 0 or m["buckets_measured_s"].get(b, 0.0) > 0
        ]
        c.print(
            table(
                "this run: measured and simulated, share of wall time",
                ["bucket", "measured", "simulated"],
                rows,
            )
        )
    rows = [
        [a["name"], duration(a["current_s"]), duration(a["closed_form_s"]), duration(a["recommended_s"])]
        for a in d["tiers"]
    ]
    c.print(table("checkpoint interval per tier", ["tier", "current", "Daly", "recommended"], rows))
    for a in d["tiers"]:
        say(f"why: {a['reason']}")
    say(f"[bold]spares:[/bold] {d['spares']['value']}  -  {d['spares']['reason']}")
    say(f"[bold]restart strategy:[/bold] {d['strategy']['value']}  -  {d['strategy']['reason']}")
    rows = [
        [
            f"{p['gpus']:,}",
            "pool" if p["spare_nodes"] is None else str(p["spare_nodes"]),
            duration(p["job_mtbf_h"] * 3600.0),
            duration(p["interval_s"]),
            percent(p["ettr_mean"]),
            percent(p["ettr_p5"]),
            compact(p["interruptions_mean"]),
            compact(p["lost_gpu_hours_mean"]),
            compact(p["cost_mean"]),
        ]
        for p in d["scale"]
    ]
    c.print(
        table(
            "predicted at scale",
            [
                "GPUs",
                "spares",
                "job\nMTBF",
                "ckpt\nevery",
                "ETTR\nmean",
                "ETTR\np5",
                "inter-\nrupts",
                "lost\nGPU-h",
                "cost",
            ],
            rows,
        )
    )
    say(
        "(interval re-optimised and spares re-chosen at each size for the most productive GPU-hours per "
        "reserved GPU-hour; job MTBF: the job's mean time between failures; ckpt every: checkpoint "
        f"interval; cost: of the lost GPU-hours and the spares at {d['gpu_hour_price']:g} a GPU-hour "
        "(gpu_hour_price of --config); k/M/B: thousands, millions, billions)"
    )
    for p in d["scale"]:
        if p.get("wait_share", 0.0) >= 0.0005:
            say(
                f"(at {p['gpus']:,} GPUs the job waits {percent(p['wait_share'])} of the time for a "
                f"repaired node: all {p['spare_nodes']} spares are in repair; the larger spare counts "
                "tried cost more GPU-hours than they save)"
            )
    opts = d.get("options") or []
    if opts:
        from ..sim.planner import OPTIONS  # deferred: heavy (numpy)

        sizes = sorted({o["gpus"] for o in opts})
        by = {(o["option"], o["gpus"]): o for o in opts}
        rows = [[name] + [percent(by[(name, g)]["ettr"]) for g in sizes] for name in OPTIONS]
        c.print(table("ETTR by recovery option and GPUs", ["option"] + [compact(g) for g in sizes], rows))
        say(
            "(mean of the trials, the same failures for every option; 5-95% bands in --json and the "
            "charts; cold: restart every process, restore from storage; warm: fork pre-imported workers, "
            "restore from host memory; peer: a replacement node restores from a peer's memory; in_place: "
            "survivors keep their processes, only replacements start, state from a live replica, no "
            "rollback; replica: the failed replica group drops out and rejoins while the others train; "
            "hot_spares: pre-initialised spare nodes (at least 1 per 256) step in; elastic: no spares, "
            "shrink instead of waiting for a repaired node)"
        )
    _print_phases(c, d, table, say)
    for line in [*_sdc_lines(d), *(f"note: {n}" for n in d["notes"])]:
        say(line)
    for p in d["plots"]:
        say(f"wrote {p}")
