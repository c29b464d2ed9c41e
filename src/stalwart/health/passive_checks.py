"""Passive checks: observations in, findings out. Pure functions; thresholds come from config.

The GPU checks live in :mod:`.gpu_checks` and the thresholds in :mod:`.passive_thresholds`; both
are re-exported here, where callers import them from.
"""

from __future__ import annotations

from .findings import Finding, Severity
from .gpu_checks import FAULT_CLOCK_BITS, check_gpus
from .gpu_observation import GpuObservation
from .infiniband import SATURATION, IbObservation
from .kernel_log import KernelLogObservation, normalise_bdf
from .mounts import MountObservation
from .passive_thresholds import PassiveThresholds
from .passive_thresholds import finding as _f

__all__ = [
    "FAULT_CLOCK_BITS",
    "PassiveThresholds",
    "check_gpus",
    "check_infiniband",
    "check_kernel_log",
    "check_mounts",
]


def check_kernel_log(
    klog: KernelLogObservation, gpus: tuple[GpuObservation, ...] = (), since_boot_s: float | None = None
) -> list[Finding]:
    """XID findings; lines stamped before ``since_boot_s`` (seconds since boot) are already handled."""
    out: list[Finding] = []
    for p in klog.problems:
        out.append(
            _f(
                "telemetry.bad",
                "kernel_log",
                Severity.WARN,
                f"kernel log: {p}",
                check="kernel_log",
                problem=p,
            )
        )
    by_bdf = {normalise_bdf(g.bus_id): f"gpu{g.index}" for g in gpus if g.bus_id}
    seen: dict[tuple[str, int], list[str]] = {}
    for x in klog.xids:
        if since_boot_s is not None and x.t_boot is not None and x.t_boot < since_boot_s:
            continue
        seen.setdefault((x.bdf, x.xid), []).append(x.text)
    for (bdf, xid), texts in seen.items():
        out.append(
            _f(
                "gpu.xid",
                by_bdf.get(bdf, bdf),
                Severity.FAIL,
                f"Xid {xid} in kernel log ({len(texts)}x): {texts[0][:120]}",
                check="kernel_log",
                xid=xid,
                bdf=bdf,
                count=len(texts),
                source=klog.source,
            )
        )
    return out


def check_infiniband(
    ib: IbObservation, th: PassiveThresholds, previous: IbObservation | None = None
) -> list[Finding]:
    out: list[Finding] = []
    prev = {p.name: p for p in previous.ports} if previous else {}
    for p in ib.ports:
        for problem in p.problems:
            out.append(_f("telemetry.bad", p.name, Severity.WARN, f"IB sysfs: {problem}", check="infiniband"))
        if p.state and p.state != "ACTIVE":
            out.append(
                _f(
                    "ib.state",
                    p.name,
                    Severity.FAIL,
                    f"port state {p.state}",
                    check="infiniband",
                    state=p.state,
                    phys_state=p.phys_state,
                )
            )
        if p.phys_state and p.phys_state != "LinkUp":
            out.append(
                _f(
                    "ib.phys_state",
                    p.name,
                    Severity.FAIL,
                    f"physical state {p.phys_state}",
                    check="infiniband",
                    phys_state=p.phys_state,
                )
            )
        if th.ib_rate_gbps and p.rate_gbps is not None and p.rate_gbps < th.ib_rate_gbps:
            out.append(
                _f(
                    "ib.rate",
                    p.name,
                    Severity.FAIL,
                    f"rate {p.rate_gbps:g} Gb/s < expected {th.ib_rate_gbps:g}",
                    check="infiniband",
                    rate=p.rate_gbps,
                    expected=th.ib_rate_gbps,
                )
            )
        before = prev.get(p.name)
        for name, value in p.counters.items():
            if SATURATION.get(name) == value:
                out.append(
                    _f(
                        "ib.counter_saturated",
                        p.name,
                        Severity.WARN,
                        f"{name} pegged at {value} (saturated: true value unknown)",
                        check="infiniband",
                        counter=name,
                        value=value,
                    )
                )
                continue
            base = before.counters.get(name, 0) if before else 0
            delta = value - base
            if name == "link_downed" and before is not None and delta > 0:
                out.append(
                    _f(
                        "ib.link_downed",
                        p.name,
                        Severity.FAIL,
                        f"link went down {delta}x since last check",
                        check="infiniband",
                        delta=delta,
                    )
                )
            elif delta > th.ib_counter_warn:
                out.append(
                    _f(
                        "ib.errors",
                        p.name,
                        Severity.WARN,
                        f"{name} +{delta}" + (" since last check" if before else " since boot"),
                        check="infiniband",
                        counter=name,
                        delta=delta,
                    )
                )
    return out


def check_mounts(mounts: tuple[MountObservation, ...], require_mountpoint: bool = True) -> list[Finding]:
    out: list[Finding] = []
    for m in mounts:
        if m.timed_out:
            out.append(
                _f(
                    "mount.hung",
                    m.path,
                    Severity.FAIL,
                    f"stat did not return within {m.stat_s:g} s",
                    check="mounts",
                )
            )
        elif m.error:
            out.append(_f("mount.error", m.path, Severity.FAIL, m.error, check="mounts"))
        elif not m.exists:
            out.append(_f("mount.missing", m.path, Severity.FAIL, "path does not exist", check="mounts"))
        elif require_mountpoint and not m.is_mount:
            out.append(
                _f(
                    "mount.not_mounted",
                    m.path,
                    Severity.FAIL,
                    "path exists but nothing is mounted there",
                    check="mounts",
                )
            )
    return out
