"""Passive GPU checks: one NVML snapshot (or a sampled series) in, findings out. Pure functions."""

from __future__ import annotations

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
    NvLinkObservation,
    clock_reason_names,
)
from .passive_thresholds import PassiveThresholds
from .passive_thresholds import finding as _f

# Clock-event bits that mean a hardware fault (SW power cap 0x4 under load is normal and ignored).
FAULT_CLOCK_BITS = {
    CLOCK_HW_SLOWDOWN: "gpu.clock.hw_slowdown",
    CLOCK_HW_THERMAL: "gpu.clock.hw_thermal",
    CLOCK_HW_POWER_BRAKE: "gpu.clock.power_brake",
}


def _gpu_findings(g: GpuObservation, th: PassiveThresholds) -> list[Finding]:
    s = f"gpu{g.index}"
    if g.lost:
        return [
            _f(
                "gpu.lost",
                s,
                Severity.FAIL,
                "GPU is lost (fallen off the bus or driver cannot reach it)",
                errors=list(g.errors),
            )
        ]
    out: list[Finding] = []
    for e in g.errors:
        out.append(_f("nvml.error", s, Severity.WARN, f"NVML call failed: {e}", error=e))
    for xid in g.xid_events:
        out.append(_f("gpu.xid", s, Severity.FAIL, f"Xid {xid} reported by NVML", xid=xid, source="nvml"))
    out.extend(_memory(s, g, th))
    out.extend(_temperature(s, g.temp_gpu, g.temp_mem, g))
    out.extend(_clocks(s, g))
    out.extend(_pcie(s, g, th))
    for link in g.nvlinks:
        out.extend(_nvlink(f"{s}/nvlink{link.link}", link, th))
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


def _memory(s: str, g: GpuObservation, th: PassiveThresholds) -> list[Finding]:
    """ECC errors and row remapping."""
    out: list[Finding] = []
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
    return out


def _clocks(s: str, g: GpuObservation) -> list[Finding]:
    """Clock-event reasons that mean a fault (one snapshot)."""
    out: list[Finding] = []
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
    return out


def _pcie(s: str, g: GpuObservation, th: PassiveThresholds) -> list[Finding]:
    """A degraded PCIe link (width, or generation under load) and replays."""
    out: list[Finding] = []
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
    return out


def _nvlink(ls: str, link: NvLinkObservation, th: PassiveThresholds) -> list[Finding]:
    out: list[Finding] = []
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
