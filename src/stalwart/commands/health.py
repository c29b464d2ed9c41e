"""``stalwart health check``: passive (and active) node checks, a per-GPU/per-link table or JSON.

Exit codes (for Slurm Prolog/Epilog and scripts): 0 = pass or warn, 1 = fail (the node should be
drained), 2 = usage/config error. As Slurm's HealthCheckProgram (whose exit code Slurm ignores) add
``--backend slurm``: the check then drains/resumes the node itself, with Stalwart's reason prefix.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import typer

from ..errors import ConfigError
from ..terminal import console, say

EXIT_PASS = 0
EXIT_FAIL = 1


def _fmt(v: object, unit: str = "") -> str:
    return "-" if v is None else f"{v:g}{unit}" if isinstance(v, float) else f"{v}{unit}"


def _print_tables(result, node: str, applied) -> None:
    from rich.table import Table  # deferred: heavy (rich)

    from ..health.gpu_observation import clock_reason_names  # deferred: heavy (pydantic)

    con = console()  # 80 columns (or COLUMNS) when piped
    gpu = result.gpu
    sev_of: dict[str, str] = {}
    for d in result.verdict.decisions:
        cur = sev_of.get(d.finding.subject.split("/")[0], "pass")
        sev_of[d.finding.subject.split("/")[0]] = max(cur, d.status, key=("pass", "warn", "fail").index)
    if gpu is not None and gpu.available:
        t = Table(title=f"GPUs on {node} ({gpu.source}, driver {gpu.driver or '?'}, CUDA {gpu.cuda or '?'})")
        for col in (
            "gpu",
            "name",
            "temp C (slow/max)",
            "HBM C",
            "clock events",
            "ECC vol c/u",
            "remap c/u/pend/fail",
            "PCIe",
            "replays",
            "NVLink up",
            "verdict",
        ):
            t.add_column(col)
        for g in gpu.gpus:
            reasons = ",".join(clock_reason_names(g.clock_event_reasons)) if g.clock_event_reasons else "-"
            links = f"{sum(1 for link in g.nvlinks if link.active)}/{len(g.nvlinks)}" if g.nvlinks else "-"
            t.add_row(
                str(g.index),
                g.name or "?",
                f"{_fmt(g.temp_gpu)} ({_fmt(g.temp_slowdown)}/{_fmt(g.temp_gpu_max)})",
                _fmt(g.temp_mem),
                reasons,
                f"{_fmt(g.ecc_vol_corr)}/{_fmt(g.ecc_vol_uncorr)}",
                f"{_fmt(g.remap_corr)}/{_fmt(g.remap_unc)}/{_fmt(g.remap_pending)}/{_fmt(g.remap_failure)}",
                f"Gen{_fmt(g.pcie_gen)}/{_fmt(g.pcie_max_gen)} x{_fmt(g.pcie_width)}/{_fmt(g.pcie_max_width)}",
                _fmt(g.pcie_replay),
                links,
                "LOST" if g.lost else sev_of.get(f"gpu{g.index}", "pass"),
            )
        con.print(t)
    elif gpu is not None:
        con.print(f"GPUs: none ({gpu.unavailable_reason})")
    if result.ib is not None and result.ib.ports:
        t = Table(title="InfiniBand ports")
        for col in ("port", "state", "phys", "rate Gb/s", "layer", "error counters", "verdict"):
            t.add_column(col)
        for p in result.ib.ports:
            errs = ", ".join(f"{k}={v}" for k, v in p.counters.items() if v) or "0"
            t.add_row(
                p.name,
                p.state,
                p.phys_state,
                _fmt(p.rate_gbps),
                p.link_layer,
                errs,
                sev_of.get(p.name, "pass"),
            )
        con.print(t)
    shown = [d for d in result.verdict.decisions if d.finding.severity > 0 or d.finding.check == "active"]
    if shown:
        t = Table(title="Findings")
        for col in ("verdict", "subject", "code", "message", "rule -> action"):
            t.add_column(col)
        for d in shown:
            t.add_row(
                d.status, d.finding.subject, d.finding.code, d.finding.message, f"{d.rule} -> {d.action}"
            )
        con.print(t)
    say(con, f"[bold]{result.verdict.reason}[/bold]  ({result.duration_s:.2f} s)")
    if applied is not None:
        say(con, f"node {node}: {applied.transition.record.state.value} -- {applied.transition.reason}")


def register(app: typer.Typer) -> None:
    health_app = typer.Typer(
        help="Node health checks (passive telemetry and active tests).", no_args_is_help=True
    )
    app.add_typer(health_app, name="health")

    @health_app.command("check")
    def check_cmd(
        active: bool = typer.Option(
            False,
            "--active",
            help="Also run the active suite (GEMM, memory, all-reduce, disk, training step).",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
        fixture: Path = typer.Option(
            None, "--fixture", help="Read recorded telemetry from this directory instead of NVML/dmesg/sysfs."
        ),
        expected_gpus: int = typer.Option(None, "--expected-gpus", help="Fail when fewer GPUs are visible."),
        mount: list[str] = typer.Option(
            [], "--mount", help="A mount point that must answer stat (repeatable)."
        ),
        ib_rate: float = typer.Option(None, "--ib-rate", help="Expected InfiniBand port rate, Gb/s."),
        kernel_log: str = typer.Option("dmesg", "--kernel-log", help="'dmesg', a log file, or '' to skip."),
        xid_wait_ms: int = typer.Option(
            0, "--xid-wait-ms", help="Also listen for NVML XID events this long."
        ),
        rules: Path = typer.Option(None, "--rules", help="A rule table (YAML) replacing the shipped one."),
        backend: str = typer.Option(
            "none",
            "--backend",
            help="none (report only), local (ledger) or slurm (drain/resume with scontrol).",
        ),
        node: str = typer.Option(
            None, "--node", help="Node name (default $SLURMD_NODENAME or the hostname)."
        ),
        state_dir: Path = typer.Option(
            None, "--state-dir", help="Where node records (ledgers) live (default stalwart-runs/health)."
        ),
        prefix: str = typer.Option(
            "stalwart:", "--prefix", help="Drain-reason prefix that marks Stalwart's drains."
        ),
        max_auto_drains: int = typer.Option(
            2,
            "--max-auto-drains",
            help="Blast-radius cap: automatic drains per window before alerting instead.",
        ),
        drain_window: float = typer.Option(3600.0, "--drain-window", help="Blast-radius window, seconds."),
        passive_readmit: bool = typer.Option(
            False, "--passive-readmit", help="Re-admit on a passing passive check (default: needs --active)."
        ),
    ) -> None:
        """Check this node; exit 0 pass/warn, 1 fail, 2 usage error (Slurm Prolog/Epilog compatible)."""
        from pydantic import ValidationError  # deferred: heavy (pydantic)

        from ..health import GateConfig, run_gate  # deferred: heavy (pydantic)
        from ..health.backends import make_backend  # deferred: heavy (pydantic)
        from ..health.lifecycle import LifecyclePolicy  # deferred: heavy (pydantic)
        from ..health.node_controller import apply_verdict  # deferred: heavy (pydantic)
        from ..health.node_store import (
            DEFAULT_STATE_DIR,
            HealthStore,
            local_node_name,
        )  # deferred: heavy (pydantic)

        if backend not in ("none", "local", "slurm"):
            raise ConfigError(f"unknown backend {backend!r}", "use none, local or slurm")
        try:
            cfg = GateConfig(
                fixture=fixture,
                expected_gpus=expected_gpus,
                mounts=tuple(mount),
                ib_rate_gbps=ib_rate,
                kernel_log=kernel_log,
                rules=rules,
                active=active,
                xid_wait_ms=xid_wait_ms,
            )
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"]).replace("_", "-")
            raise ConfigError(
                f"invalid health check option --{where}: {err['msg']}", "see 'stalwart health check --help'"
            ) from exc
        from ..health.lifecycle import NodeState  # deferred: heavy (pydantic)

        node = node or local_node_name()
        now = time.time()
        store = HealthStore(state_dir or DEFAULT_STATE_DIR)
        handled_before = None
        if backend != "none":
            rec = store.record(node)
            if rec.state in (NodeState.QUARANTINED, NodeState.PROBATION):
                handled_before = rec.since  # XIDs logged before the drain are what we drained for
        if active:  # the suite runs for seconds with nothing to show until it ends: say so first
            print(
                "stalwart: running the active suite (GEMM, memory bandwidth, all-reduce, disk write, one "
                "training step; 10-20 s on a CPU-only machine) ...",
                file=sys.stderr,
                flush=True,
            )
        result = run_gate(
            cfg,
            now,
            node=node,
            handled_before=handled_before,
            progress=(lambda line: print(f"stalwart: active: {line}", file=sys.stderr, flush=True))
            if active
            else None,
        )
        if active:
            took = result.timings.get("active")
            print("stalwart: active suite done" + (f" in {took:.1f} s" if took else ""), file=sys.stderr)
        applied = None
        if backend != "none":
            policy = LifecyclePolicy(
                prefix=prefix,
                max_auto_drains=max_auto_drains,
                drain_window_s=drain_window,
                readmit_requires_active=not passive_readmit,
            )
            applied = apply_verdict(
                node,
                result.verdict,
                level="active" if active else "passive",
                backend=make_backend(backend),
                store=store,
                policy=policy,
                now=now,
                duration_s=result.duration_s,
            )
        if json_out:
            data = {
                "node": node,
                "passed": result.passed,
                "verdict": {
                    "status": result.verdict.status,
                    "action": result.verdict.action,
                    "recoverable": result.verdict.recoverable,
                    "reason": result.verdict.reason,
                },
                "findings": [
                    d.finding.to_json() | {"rule": d.rule, "verdict": d.status, "action": d.action}
                    for d in result.verdict.decisions
                ],
                "gpu": None
                if result.gpu is None
                else {
                    "source": result.gpu.source,
                    "available": result.gpu.available,
                    "unavailable_reason": result.gpu.unavailable_reason,
                    "driver": result.gpu.driver,
                    "cuda": result.gpu.cuda,
                    "gpus": [dataclasses.asdict(g) for g in result.gpu.gpus],
                    "samples": len(result.gpu.series),
                },
                "ib_ports": [] if result.ib is None else [dataclasses.asdict(p) for p in result.ib.ports],
                "duration_s": result.duration_s,
                "timings": result.timings,
            }
            if applied is not None:
                data["lifecycle"] = {
                    "state": applied.transition.record.state.value,
                    "action": applied.transition.action,
                    "reason": applied.transition.reason,
                    "read_back": applied.read_back,
                }
            print(json.dumps(data, indent=1, default=str))
        else:
            _print_tables(result, node, applied)
        raise typer.Exit(EXIT_PASS if result.passed else EXIT_FAIL)
