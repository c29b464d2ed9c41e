"""Passive checks: observations in, findings out. Pure functions; thresholds come from config."""

from __future__ import annotations

from dataclasses import dataclass

from .findings import Finding, Severity
from .gpu_observation import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_THERMAL,
    GpuNodeObservation,
    GpuObservation,
    GpuSample,
    clock_reason_names,
)
from .infiniband import SATURATION, IbObservation
from .kernel_log import KernelLogObservation, normalise_bdf
from .mounts import MountObservation

# Clock-event bits that mean a hardware fault (SW power cap 0x4 under load is normal and ignored).
FAULT_CLOCK_BITS = {
    CLOCK_HW_SLOWDOWN: "gpu.clock.hw_slowdown",
    CLOCK_HW_THERMAL: "gpu.clock.hw_thermal",
    CLOCK_HW_POWER_BRAKE: "gpu.clock.power_brake",
}


@dataclass(frozen=True)
class PassiveThresholds:
    expected_gpus: int | None = None
    ecc_correctable_warn: int = 20_000_000  # AzNHC DRAM correctable limit
    remap_uncorrectable_warn: int = 512  # DCGM MAX_ROW_REMAP_UNCORRECTABLE
    pcie_replay_per_min: float = 31.0  # DCGM: Gen5 x16 ~ 31/min (Gen4 x16 ~ 16/min)
    pcie_replay_abs_warn: int = 10_000
    nvlink_crc_warn: int = 100
    hw_clock_min_fraction: float = 0.05  # of loaded samples in a series; a blip is not a fault
    hw_clock_min_samples: int = 3
    ib_rate_gbps: float | None = None
    ib_counter_warn: int = 100


def _f(code: str, subject: str, sev: Severity, msg: str, check: str = "gpu", **evidence: object) -> Finding:
    return Finding(check=check, code=code, subject=subject, severity=sev, message=msg, evidence=evidence)


def _gpu_findings(g: GpuObservation, th: PassiveThresholds) -> list[Finding]:
    s = f"gpu{g.index}"
    out: list[Finding] = []
    if g.lost:
        out.append(
            _f(
                "gpu.lost",
                s,
                Severity.FAIL,
                "GPU is lost (fallen off the bus or driver cannot reach it)",
                errors=list(g.errors),
            )
        )
        return out
    for e in g.errors:
        out.append(_f("nvml.error", s, Severity.WARN, f"NVML call failed: {e}", error=e))
    for xid in g.xid_events:
        out.append(_f("gpu.xid", s, Severity.FAIL, f"Xid {xid} reported by NVML", xid=xid, source="nvml"))
    if g.ecc_vol_uncorr:
        out.append(
            _f(
                "gpu.ecc.uncorrectable",
                s,
                Severity.FAIL,
                f"{g.ecc_vol_uncorr} uncorrectable ECC errors since the driver loaded",
                volatile_uncorrectable=g.ecc_vol_uncorr,
            )
        )
    if g.ecc_vol_corr is not None and g.ecc_vol_corr > th.ecc_correctable_warn:
        out.append(
            _f(
                "gpu.ecc.correctable",
                s,
                Severity.WARN,
                f"{g.ecc_vol_corr} correctable ECC errors (> {th.ecc_correctable_warn})",
                volatile_correctable=g.ecc_vol_corr,
            )
        )
    if g.remap_failure:
        out.append(
            _f(
                "gpu.remap.failure",
                s,
                Severity.FAIL,
                "row remapping failed (spare rows exhausted)",
                remap_unc=g.remap_unc,
                remap_corr=g.remap_corr,
            )
        )
    if g.remap_pending:
        out.append(
            _f(
                "gpu.remap.pending",
                s,
                Severity.FAIL,
                "row remap pending: GPU reset needed to apply it",
                remap_unc=g.remap_unc,
                remap_corr=g.remap_corr,
            )
        )
    if g.remap_unc is not None and g.remap_unc >= th.remap_uncorrectable_warn:
        out.append(
            _f(
                "gpu.remap.uncorrectable",
                s,
                Severity.WARN,
                f"{g.remap_unc} rows remapped for uncorrectable errors",
                remap_unc=g.remap_unc,
            )
        )
    out.extend(_temperature(s, g.temp_gpu, g.temp_mem, g))
    if g.clock_event_reasons is not None:
        for bit, code in FAULT_CLOCK_BITS.items():
            if g.clock_event_reasons & bit:
                out.append(
                    _f(
                        code,
                        s,
                        Severity.FAIL,
                        f"clock-event reason {clock_reason_names(bit)[0]} active",
                        mask=hex(g.clock_event_reasons),
                        reasons=clock_reason_names(g.clock_event_reasons),
                    )
                )
        if g.clock_event_reasons & CLOCK_SW_THERMAL:
            out.append(
                _f(
                    "gpu.clock.sw_thermal",
                    s,
                    Severity.WARN,
                    "SW thermal slowdown active",
                    mask=hex(g.clock_event_reasons),
                )
            )
    idle = bool(g.clock_event_reasons and g.clock_event_reasons & CLOCK_GPU_IDLE)
    if g.pcie_width is not None and g.pcie_max_width and g.pcie_width < g.pcie_max_width:
        out.append(
            _f(
                "gpu.pcie.degraded",
                s,
                Severity.FAIL,
                f"PCIe link x{g.pcie_width}, device supports x{g.pcie_max_width}",
                width=g.pcie_width,
                max_width=g.pcie_max_width,
            )
        )
    if g.pcie_gen is not None and g.pcie_max_gen and g.pcie_gen < g.pcie_max_gen:
        # links downshift at idle to save power; only a loaded GPU on a slow link is a fault
        out.append(
            _f(
                "gpu.pcie.degraded",
                s,
                Severity.WARN if idle else Severity.FAIL,
                f"PCIe Gen{g.pcie_gen}, device supports Gen{g.pcie_max_gen}"
                + (" (idle: may be power saving)" if idle else ""),
                gen=g.pcie_gen,
                max_gen=g.pcie_max_gen,
                idle=idle,
            )
        )
    if g.pcie_replay is not None and g.pcie_replay > th.pcie_replay_abs_warn:
        out.append(
            _f(
                "gpu.pcie.replay",
                s,
                Severity.WARN,
                f"{g.pcie_replay} PCIe replays since boot",
                replays=g.pcie_replay,
            )
        )
    for link in g.nvlinks:
        ls = f"{s}/nvlink{link.link}"
        if link.active is False:
            out.append(_f("gpu.nvlink.down", ls, Severity.FAIL, "NVLink inactive", link=link.link))
        if (link.replay or 0) > 0 or (link.recovery or 0) > 0:
            out.append(
                _f(
                    "gpu.nvlink.errors",
                    ls,
                    Severity.FAIL,
                    f"NVLink replay={link.replay} recovery={link.recovery}",
                    replay=link.replay,
                    recovery=link.recovery,
                )
            )
        crc = (link.crc_flit or 0) + (link.crc_data or 0)
        if crc > th.nvlink_crc_warn:
            out.append(
                _f(
                    "gpu.nvlink.crc",
                    ls,
                    Severity.WARN,
                    f"{crc} NVLink CRC errors",
                    crc_flit=link.crc_flit,
                    crc_data=link.crc_data,
                )
            )
    if g.recovery_action:
        out.append(
            _f(
                "gpu.recovery_action",
                s,
                Severity.FAIL,
                f"NVML recommends recovery action {g.recovery_action}",
                action=g.recovery_action,
            )
        )
    return out


def _temperature(s: str, temp: float | None, temp_mem: float | None, g: GpuObservation) -> list[Finding]:
    out = []
    if temp is not None and g.temp_slowdown is not None and temp >= g.temp_slowdown:
        out.append(
            _f(
                "gpu.temp.slowdown",
                s,
                Severity.FAIL,
                f"GPU at {temp:g} C, at/above its slowdown threshold {g.temp_slowdown:g} C",
                temp=temp,
                slowdown=g.temp_slowdown,
            )
        )
    elif temp is not None and g.temp_gpu_max is not None and temp >= g.temp_gpu_max:
        out.append(
            _f(
                "gpu.temp.max_operating",
                s,
                Severity.WARN,
                f"GPU at {temp:g} C, at/above max operating {g.temp_gpu_max:g} C",
                temp=temp,
                gpu_max=g.temp_gpu_max,
            )
        )
    if temp_mem is not None and g.temp_mem_max is not None and temp_mem >= g.temp_mem_max:
        out.append(
            _f(
                "gpu.temp.memory",
                s,
                Severity.FAIL,
                f"HBM at {temp_mem:g} C, at/above its limit {g.temp_mem_max:g} C",
                temp_mem=temp_mem,
                mem_max=g.temp_mem_max,
            )
        )
    return out


def _series_findings(
    series: tuple[GpuSample, ...], gpus: dict[int, GpuObservation], th: PassiveThresholds
) -> list[Finding]:
    out: list[Finding] = []
    for idx in sorted({x.gpu for x in series}):
        rows = sorted((x for x in series if x.gpu == idx), key=lambda x: x.t)
        s = f"gpu{idx}"
        loaded = [r for r in rows if not (r.clock_event_reasons or 0) & CLOCK_GPU_IDLE] or rows
        for bit, code in FAULT_CLOCK_BITS.items():
            hits = [r for r in loaded if (r.clock_event_reasons or 0) & bit]
            if len(hits) >= th.hw_clock_min_samples and len(hits) >= th.hw_clock_min_fraction * len(loaded):
                out.append(
                    _f(
                        code,
                        s,
                        Severity.FAIL,
                        f"{clock_reason_names(bit)[0]} in {len(hits)} of {len(loaded)} samples "
                        f"({hits[0].t:g}-{hits[-1].t:g} s)",
                        samples=len(hits),
                        of=len(loaded),
                        first_t=hits[0].t,
                        last_t=hits[-1].t,
                    )
                )
        g = gpus.get(idx)
        if g is not None:
            hottest = max(rows, key=lambda r: r.temp_gpu or -1e9)
            hottest_mem = max(rows, key=lambda r: r.temp_mem or -1e9)
            for f in _temperature(s, hottest.temp_gpu, hottest_mem.temp_mem, g):
                out.append(
                    Finding(
                        f.check,
                        f.code,
                        f.subject,
                        f.severity,
                        f.message + f" (t={hottest.t:g} s)",
                        {**f.evidence, "t": hottest.t},
                    )
                )
        eccs = [r.ecc_corr_vol for r in rows if r.ecc_corr_vol is not None]
        if len(eccs) >= 2 and eccs[-1] > eccs[0]:
            out.append(
                _f(
                    "gpu.ecc.correctable_rising",
                    s,
                    Severity.WARN,
                    f"correctable ECC rose {eccs[0]} -> {eccs[-1]} during sampling",
                    start=eccs[0],
                    end=eccs[-1],
                )
            )
        reps = [(r.t, r.pcie_replay) for r in rows if r.pcie_replay is not None]
        if len(reps) >= 2 and reps[-1][0] > reps[0][0]:
            rate = (reps[-1][1] - reps[0][1]) / ((reps[-1][0] - reps[0][0]) / 60.0)
            if rate > th.pcie_replay_per_min:
                out.append(
                    _f(
                        "gpu.pcie.replay_rate",
                        s,
                        Severity.WARN,
                        f"PCIe replays at {rate:.1f}/min (> {th.pcie_replay_per_min:g}/min)",
                        per_min=rate,
                    )
                )
    return out


def check_gpus(obs: GpuNodeObservation, th: PassiveThresholds) -> list[Finding]:
    out: list[Finding] = []
    for p in obs.problems:
        out.append(_f("telemetry.bad", "node", Severity.WARN, f"unreadable GPU telemetry: {p}", problem=p))
    for what in obs.timed_out:
        out.append(
            _f("nvml.timeout", "node", Severity.FAIL, f"NVML call {what} hung past its deadline", call=what)
        )
    if not obs.available:
        if obs.problems:
            return out  # unreadable telemetry is its own finding; it does not prove the GPUs are gone
        if th.expected_gpus:
            out.append(
                _f(
                    "gpu.count",
                    "node",
                    Severity.FAIL,
                    f"expected {th.expected_gpus} GPUs, none visible: {obs.unavailable_reason}",
                    expected=th.expected_gpus,
                    found=0,
                )
            )
        else:
            out.append(
                _f(
                    "gpu.absent",
                    "node",
                    Severity.INFO,
                    f"no GPU checks: {obs.unavailable_reason}",
                    reason=obs.unavailable_reason,
                )
            )
        return out
    if th.expected_gpus is not None and len(obs.gpus) < th.expected_gpus:
        out.append(
            _f(
                "gpu.count",
                "node",
                Severity.FAIL,
                f"{len(obs.gpus)} GPUs visible, expected {th.expected_gpus}",
                expected=th.expected_gpus,
                found=len(obs.gpus),
            )
        )
    for g in obs.gpus:
        out.extend(_gpu_findings(g, th))
    out.extend(_series_findings(obs.series, {g.index: g for g in obs.gpus}, th))
    return out


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
