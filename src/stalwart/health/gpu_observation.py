"""What a collector saw on a node's GPUs: plain frozen data, no judgement."""

from __future__ import annotations

from dataclasses import dataclass

# Clock-event (throttle) reason bits, from NVML's nvmlClocksEventReason* constants.
CLOCK_GPU_IDLE = 0x1
CLOCK_APP_SETTING = 0x2
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SYNC_BOOST = 0x10
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80
CLOCK_NAMES = {
    CLOCK_GPU_IDLE: "gpu_idle",
    CLOCK_APP_SETTING: "applications_clocks_setting",
    CLOCK_SW_POWER_CAP: "sw_power_cap",
    CLOCK_HW_SLOWDOWN: "hw_slowdown",
    CLOCK_SYNC_BOOST: "sync_boost",
    CLOCK_SW_THERMAL: "sw_thermal_slowdown",
    CLOCK_HW_THERMAL: "hw_thermal_slowdown",
    CLOCK_HW_POWER_BRAKE: "hw_power_brake_slowdown",
}


def clock_reason_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_NAMES.items() if mask & bit]


@dataclass(frozen=True)
class NvLinkObservation:
    link: int
    active: bool | None = None
    replay: int | None = None
    recovery: int | None = None
    crc_flit: int | None = None
    crc_data: int | None = None


@dataclass(frozen=True)
class GpuObservation:
    """One GPU at one instant. ``None`` means not supported / not read, never "zero"."""

    index: int
    name: str = ""
    uuid: str = ""
    bus_id: str = ""
    temp_gpu: float | None = None
    temp_mem: float | None = None
    temp_shutdown: float | None = None
    temp_slowdown: float | None = None
    temp_gpu_max: float | None = None
    temp_mem_max: float | None = None
    clock_event_reasons: int | None = None
    utilization: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc_enabled: bool | None = None
    ecc_vol_corr: int | None = None
    ecc_vol_uncorr: int | None = None
    ecc_agg_corr: int | None = None
    ecc_agg_uncorr: int | None = None
    remap_corr: int | None = None
    remap_unc: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_gen: int | None = None
    pcie_max_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_width: int | None = None
    pcie_replay: int | None = None
    nvlinks: tuple[NvLinkObservation, ...] = ()
    xid_events: tuple[int, ...] = ()
    recovery_action: int | None = None
    lost: bool = False
    errors: tuple[str, ...] = ()  # calls that failed with something other than NotSupported


@dataclass(frozen=True)
class GpuSample:
    """One row of a sampled time series (e.g. during a GEMM burn)."""

    t: float
    gpu: int = 0
    phase: str = ""
    temp_gpu: float | None = None
    temp_mem: float | None = None
    power_w: float | None = None
    sm_mhz: float | None = None
    util: float | None = None
    clock_event_reasons: int | None = None
    ecc_corr_vol: int | None = None
    pcie_replay: int | None = None


@dataclass(frozen=True)
class GpuNodeObservation:
    """Everything the GPU collector saw on one node."""

    source: str
    available: bool
    unavailable_reason: str = ""
    driver: str = ""
    cuda: str = ""
    gpus: tuple[GpuObservation, ...] = ()
    series: tuple[GpuSample, ...] = ()
    problems: tuple[str, ...] = ()  # telemetry that could not be read or parsed
    timed_out: tuple[str, ...] = ()  # calls that hit their deadline
