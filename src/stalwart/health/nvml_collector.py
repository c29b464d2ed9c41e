"""Observe GPUs through NVML (``nvidia-ml-py``, module ``pynvml``), every call under a deadline.

The NVML module is injectable so tests can replay recorded values or simulate a hung or lost GPU.
No library / no driver is a normal, reported case (``available=False``), not an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any, TypeVar

from .deadline import CallTimedOut, call_with_timeout
from .gpu_observation import GpuNodeObservation, GpuObservation, NvLinkObservation

T = TypeVar("T")

_NVLINK_ERRORS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}


def _import_nvml() -> ModuleType | None:
    try:
        import pynvml  # deferred: optional extra (nvidia-ml-py)
    except ImportError:
        return None
    return pynvml


# Any: pynvml is untyped (the optional nvidia-ml-py extra)
def _later(nvml: Any, name: str, *args: Any) -> Callable[[], Any]:
    """A deferred NVML call with its arguments bound now; the function is looked up when it runs
    (inside the reader's deadline and error handling)."""
    return lambda: getattr(nvml, name)(*args)


def _err_name(exc: BaseException) -> str:
    return type(exc).__name__.replace("NVMLError_", "")


class _Reader:
    """Wraps one NVML module: each read has a deadline; NotSupported reads as None."""

    # Any: pynvml is untyped (the optional nvidia-ml-py extra)
    def __init__(self, nvml: Any, timeout_s: float) -> None:
        self.nvml = nvml
        self.timeout_s = timeout_s
        self.errors: list[str] = []
        self.timed_out: list[str] = []

    def read(self, what: str, fn: Callable[[], T]) -> T | None:
        try:
            return call_with_timeout(fn, self.timeout_s, what)
        except CallTimedOut:
            self.timed_out.append(what)
            return None
        except self.nvml.NVMLError as exc:
            name = _err_name(exc)
            if name not in ("NotSupported", "FunctionNotFound", "InvalidArgument"):
                self.errors.append(f"{what}: {name}")
            return None
        except Exception as exc:  # a broken binding or odd return value: report it, never crash
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}")
            return None


def _gpu(r: _Reader, index: int, nvlink_max: int, xid_events: tuple[int, ...]) -> GpuObservation:
    n = r.nvml
    before = len(r.errors)
    h = r.read(f"gpu{index}.handle", lambda: n.nvmlDeviceGetHandleByIndex(index))
    if h is None:
        errs = tuple(r.errors[before:])
        return GpuObservation(index=index, lost=True, errors=errs or ("handle: unavailable",))

    def s(v: object) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    thr = {
        k: r.read(f"gpu{index}.temp_threshold.{k}", _later(n, "nvmlDeviceGetTemperatureThreshold", h, i))
        for k, i in (("shutdown", 0), ("slowdown", 1), ("mem_max", 2), ("gpu_max", 3))
    }
    remap = r.read(f"gpu{index}.remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h))
    ecc_mode = r.read(f"gpu{index}.ecc_mode", lambda: n.nvmlDeviceGetEccMode(h))

    def ecc(err_type: int, counter: int) -> int | None:
        return r.read(
            f"gpu{index}.ecc.{err_type}.{counter}",
            lambda: n.nvmlDeviceGetTotalEccErrors(h, err_type, counter),
        )

    def field(fid: int) -> float | None:
        vals = r.read(f"gpu{index}.field.{fid}", lambda: n.nvmlDeviceGetFieldValues(h, [fid]))
        if not vals or getattr(vals[0], "nvmlReturn", 1) != 0:
            return None
        v = vals[0]
        return float(
            getattr(
                v.value,
                {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
                    v.valueType, "ullVal"
                ),
            )
        )

    links = []
    for link in range(nvlink_max):
        state = r.read(f"gpu{index}.nvlink{link}.state", _later(n, "nvmlDeviceGetNvLinkState", h, link))
        if state is None:
            break  # NotSupported: no such link (or no NVLink at all)
        counters = {
            name: r.read(
                f"gpu{index}.nvlink{link}.{name}",
                _later(n, "nvmlDeviceGetNvLinkErrorCounter", h, link, c),
            )
            for name, c in _NVLINK_ERRORS.items()
        }
        links.append(NvLinkObservation(link=link, active=bool(state), **counters))
    power = r.read(f"gpu{index}.power", lambda: n.nvmlDeviceGetPowerUsage(h))
    limit = r.read(f"gpu{index}.power_limit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))
    util = r.read(f"gpu{index}.utilization", lambda: n.nvmlDeviceGetUtilizationRates(h))
    reasons_fn = (
        getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or n.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    pci = r.read(f"gpu{index}.pci", lambda: n.nvmlDeviceGetPciInfo(h))
    mem_temp = field(82)  # NVML_FI_DEV_MEMORY_TEMP
    recovery = field(230)  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    values = GpuObservation(
        index=index,
        name=s(r.read(f"gpu{index}.name", lambda: n.nvmlDeviceGetName(h)) or ""),
        uuid=s(r.read(f"gpu{index}.uuid", lambda: n.nvmlDeviceGetUUID(h)) or ""),
        bus_id=s(getattr(pci, "busId", "") or ""),
        temp_gpu=r.read(f"gpu{index}.temperature", lambda: n.nvmlDeviceGetTemperature(h, 0)),
        temp_mem=mem_temp,
        temp_shutdown=thr["shutdown"],
        temp_slowdown=thr["slowdown"],
        temp_gpu_max=thr["gpu_max"],
        temp_mem_max=thr["mem_max"],
        clock_event_reasons=r.read(f"gpu{index}.clock_event_reasons", lambda: reasons_fn(h)),
        utilization=None if util is None else float(util.gpu),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        ecc_enabled=None if not ecc_mode else bool(ecc_mode[0]),
        ecc_vol_corr=ecc(0, 0),
        ecc_vol_uncorr=ecc(1, 0),
        ecc_agg_corr=ecc(0, 1),
        ecc_agg_uncorr=ecc(1, 1),
        remap_corr=None if remap is None else int(remap[0]),
        remap_unc=None if remap is None else int(remap[1]),
        remap_pending=None if remap is None else bool(remap[2]),
        remap_failure=None if remap is None else bool(remap[3]),
        pcie_gen=r.read(f"gpu{index}.pcie_gen", lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        pcie_max_gen=r.read(f"gpu{index}.pcie_max_gen", lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        pcie_width=r.read(f"gpu{index}.pcie_width", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h)),
        pcie_max_width=r.read(f"gpu{index}.pcie_max_width", lambda: n.nvmlDeviceGetMaxPcieLinkWidth(h)),
        pcie_replay=r.read(f"gpu{index}.pcie_replay", lambda: n.nvmlDeviceGetPcieReplayCounter(h)),
        nvlinks=tuple(links),
        xid_events=xid_events,
        recovery_action=None if recovery is None else int(recovery),
    )
    errs = tuple(r.errors[before:])  # after every read above
    lost = any(e.endswith((": GpuIsLost", ": Unknown")) for e in errs)
    return replace(values, lost=lost, errors=errs)


def _xid_events(r: _Reader, count: int, wait_ms: int) -> dict[int, tuple[int, ...]]:
    """Drain pending XID events (NVML delivers events that arrive after registration only)."""
    n = r.nvml
    found: dict[int, list[int]] = {}
    if wait_ms <= 0:
        return {}
    es = r.read("event_set", n.nvmlEventSetCreate)
    if es is None:
        return {}
    handles = {}
    for i in range(count):
        h = r.read(f"gpu{i}.handle", _later(n, "nvmlDeviceGetHandleByIndex", i))
        if h is not None:
            handles[i] = h

            def register(h: Any = h) -> Any:  # Any: pynvml is untyped (the optional nvidia-ml-py extra)
                return n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)

            r.read(f"gpu{i}.register_events", register)
    deadline = time.monotonic() + wait_ms / 1000.0
    while time.monotonic() < deadline:
        try:
            data = call_with_timeout(lambda: n.nvmlEventSetWait(es, 100), r.timeout_s, "event_wait")
        except n.NVMLError:
            continue  # NVMLError_Timeout: nothing arrived
        except CallTimedOut:
            r.timed_out.append("event_wait")
            break
        for i, h in handles.items():
            if data.device == h:
                found.setdefault(i, []).append(int(data.eventData))
    r.read("event_set_free", lambda: n.nvmlEventSetFree(es))
    return {i: tuple(v) for i, v in found.items()}


def collect_nvml(
    nvml: Any = None,  # Any: pynvml is untyped (the optional nvidia-ml-py extra)
    *,
    timeout_s: float = 5.0,
    xid_wait_ms: int = 0,
    nvlink_max: int = 18,
) -> GpuNodeObservation:
    """Read every GPU through NVML. ``nvml`` defaults to the real ``pynvml`` module."""
    nvml = nvml if nvml is not None else _import_nvml()
    if nvml is None:
        return GpuNodeObservation(
            source="nvml",
            available=False,
            unavailable_reason="nvidia-ml-py is not installed (pip install 'stalwart[gpu]')",
        )
    r = _Reader(nvml, timeout_s)
    try:
        call_with_timeout(nvml.nvmlInit, timeout_s, "nvmlInit")
    except CallTimedOut:
        return GpuNodeObservation(
            source="nvml", available=False, unavailable_reason="nvmlInit hung", timed_out=("nvmlInit",)
        )
    except nvml.NVMLError as exc:
        name = _err_name(exc)
        if name in ("LibraryNotFound", "DriverNotLoaded"):
            return GpuNodeObservation(
                source="nvml",
                available=False,
                unavailable_reason=f"no NVIDIA GPU driver on this machine ({name})",
            )
        return GpuNodeObservation(
            source="nvml",
            available=False,
            unavailable_reason=f"nvmlInit failed: {name}",
            problems=(f"nvmlInit: {name}",),
        )
    try:
        driver = r.read("driver_version", nvml.nvmlSystemGetDriverVersion) or ""
        cuda = r.read("cuda_driver_version", nvml.nvmlSystemGetCudaDriverVersion)
        count = r.read("device_count", nvml.nvmlDeviceGetCount)
        if count is None:
            return GpuNodeObservation(
                source="nvml",
                available=True,
                driver=str(driver),
                problems=tuple(r.errors),
                timed_out=tuple(r.timed_out),
            )
        xids = _xid_events(r, count, xid_wait_ms)
        gpus = tuple(_gpu(r, i, nvlink_max, xids.get(i, ())) for i in range(count))
    finally:
        try:
            call_with_timeout(nvml.nvmlShutdown, timeout_s, "nvmlShutdown")
        except (CallTimedOut, nvml.NVMLError):
            pass
    cuda_s = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if isinstance(cuda, int) else ""
    driver_s = driver.decode() if isinstance(driver, bytes) else str(driver)
    return GpuNodeObservation(
        source="nvml", available=True, driver=driver_s, cuda=cuda_s, gpus=gpus, timed_out=tuple(r.timed_out)
    )
