"""The NVML collector against a fake ``pynvml`` that replays the recorded H100 snapshot."""

from __future__ import annotations

import json
import threading
import types
from pathlib import Path

import pynvml
import pytest

from stalwart.health.deadline import CallTimedOut, call_with_timeout
from stalwart.health.gpu_fixtures import load_nvml_snapshot
from stalwart.health.nvml_collector import collect_nvml
from stalwart.health.passive_checks import PassiveThresholds, check_gpus

SNAP = Path(__file__).parent.parent / "fixtures" / "gpu" / "h100" / "nvml_snapshot.json"


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def fake_nvml(
    overrides: dict | None = None,
    *,
    init_error: int | None = None,
    hang: set[str] | None = None,
    lost: bool = False,
    xids: tuple[int, ...] = (),
) -> types.SimpleNamespace:
    """A stand-in module: values from the recorded snapshot, errors and hangs where asked."""
    d = json.loads(SNAP.read_text())["nvml"] | (overrides or {})
    gate = threading.Event()  # never set: a "hung" call blocks until the test process ends
    hang = hang or set()

    def val(name, v):
        def fn(*_a):
            if name in hang:
                gate.wait()
            if lost and name not in ("count", "handle", "driver", "cuda"):
                raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
            if isinstance(v, str) and v.startswith("EXC"):
                raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return v

        return fn

    thr = {
        0: d["temp_thr_shutdown"],
        1: d["temp_thr_slowdown"],
        2: d["temp_thr_mem_max"],
        3: d["temp_thr_gpu_max"],
    }
    remap = d["remapped_rows"]

    def init():
        if "init" in hang:
            gate.wait()
        if init_error is not None:
            raise _err(init_error)

    def field_values(_h, ids):
        out = []
        for fid in ids:
            v = types.SimpleNamespace(nvmlReturn=0, valueType=1, value=types.SimpleNamespace(uiVal=0))
            if fid == 82:
                v.value.uiVal = d["field_values"]["NVML_FI_DEV_MEMORY_TEMP"]
            elif fid == 230:
                v.value.uiVal = d.get("recovery_action", 0)
            out.append(v)
        return out

    handle = object()
    pending = list(xids)
    registered: list[int] = []

    def event_wait(_es, _ms):
        if not pending or not registered:
            raise _err(pynvml.NVML_ERROR_TIMEOUT)  # what real NVML raises when nothing arrived
        return types.SimpleNamespace(device=handle, eventType=registered[0], eventData=pending.pop(0))

    return types.SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        nvmlEventTypeXidCriticalError=pynvml.nvmlEventTypeXidCriticalError,
        nvmlEventSetCreate=lambda: "es",
        nvmlEventSetFree=lambda es: None,
        nvmlEventSetWait=event_wait,
        nvmlDeviceRegisterEvents=lambda h, mask, es: registered.append(mask),
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=val("driver", d["driver"]),
        nvmlSystemGetCudaDriverVersion=val("cuda", d["cuda_driver"]),
        nvmlDeviceGetCount=val("count", d["count"]),
        nvmlDeviceGetHandleByIndex=val("handle", handle),
        nvmlDeviceGetName=val("name", d["name"]),
        nvmlDeviceGetUUID=val("uuid", d["uuid"]),
        nvmlDeviceGetPciInfo=val("pci", types.SimpleNamespace(busId=d["pci"]["busId"])),
        nvmlDeviceGetTemperature=val("temp", d["temp_gpu"]),
        nvmlDeviceGetTemperatureThreshold=lambda h, i: val("thr", thr[i])(),
        nvmlDeviceGetRemappedRows=val("remap", tuple(remap)),
        nvmlDeviceGetEccMode=val("ecc_mode", tuple(d["ecc_mode"])),
        nvmlDeviceGetTotalEccErrors=lambda h, e, c: val(
            "ecc",
            {
                (0, 0): d["ecc_vol_corr"],
                (1, 0): d["ecc_vol_uncorr"],
                (0, 1): d["ecc_agg_corr"],
                (1, 1): d["ecc_agg_uncorr"],
            }[(e, c)],
        )(),
        nvmlDeviceGetFieldValues=field_values,
        nvmlDeviceGetNvLinkState=val("nvlink", d["nvlink0_state"]),
        nvmlDeviceGetNvLinkErrorCounter=val("nvlink_err", 0),
        nvmlDeviceGetPowerUsage=val("power", d["power_mw"]),
        nvmlDeviceGetEnforcedPowerLimit=val("power_limit", d["power_limit_mw"]),
        nvmlDeviceGetUtilizationRates=val("util", types.SimpleNamespace(gpu=d["util"]["gpu"])),
        nvmlDeviceGetCurrentClocksEventReasons=val("clocks", d["clock_event_reasons"]),
        nvmlDeviceGetCurrPcieLinkGeneration=val("pcie_gen", d["pcie_gen"]),
        nvmlDeviceGetMaxPcieLinkGeneration=val("pcie_max_gen", d["pcie_max_gen"]),
        nvmlDeviceGetCurrPcieLinkWidth=val("pcie_width", d["pcie_width"]),
        nvmlDeviceGetMaxPcieLinkWidth=val("pcie_max_width", d["pcie_max_width"]),
        nvmlDeviceGetPcieReplayCounter=val("pcie_replay", d["pcie_replay"]),
    )


def test_collector_reads_the_same_values_as_the_recording():
    live = collect_nvml(fake_nvml(), timeout_s=2.0)
    rec = load_nvml_snapshot(SNAP)
    assert live.available and live.driver == "580.159.04" and live.cuda == "13.0"
    g, r = live.gpus[0], rec.gpus[0]
    for f in (
        "name",
        "uuid",
        "bus_id",
        "temp_gpu",
        "temp_mem",
        "temp_slowdown",
        "temp_gpu_max",
        "clock_event_reasons",
        "ecc_vol_uncorr",
        "remap_pending",
        "remap_failure",
        "pcie_gen",
        "pcie_width",
        "pcie_replay",
    ):
        assert getattr(g, f) == getattr(r, f), f
    assert g.nvlinks == ()  # NotSupported on this PCIe H100: no links, not "down"
    assert check_gpus(live, PassiveThresholds(expected_gpus=1)) == []


def test_remap_pending_through_nvml():
    live = collect_nvml(fake_nvml({"remapped_rows": [0, 1, 1, 0]}), timeout_s=2.0)
    assert [f.code for f in check_gpus(live, PassiveThresholds())] == ["gpu.remap.pending"]


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_library_is_a_normal_case(code):
    obs = collect_nvml(fake_nvml(init_error=code))
    assert not obs.available and "no NVIDIA GPU driver" in obs.unavailable_reason
    (f,) = check_gpus(obs, PassiveThresholds())
    assert f.code == "gpu.absent" and f.severity.name == "INFO"


def test_real_pynvml_without_a_gpu_reports_absent():
    obs = collect_nvml(timeout_s=5.0)  # this machine has no NVIDIA driver
    assert obs.available is False or obs.gpus  # on a GPU machine this collects for real
    if not obs.available:
        assert "LibraryNotFound" in obs.unavailable_reason or "DriverNotLoaded" in obs.unavailable_reason


def test_hung_nvml_call_becomes_a_finding_not_a_hang():
    obs = collect_nvml(fake_nvml(hang={"remap"}), timeout_s=0.2)
    assert "gpu0.remapped_rows" in obs.timed_out
    assert obs.gpus[0].temp_gpu == 44  # the other reads still happened
    codes = [f.code for f in check_gpus(obs, PassiveThresholds())]
    assert codes == ["nvml.timeout"]


def test_hung_init():
    obs = collect_nvml(fake_nvml(hang={"init"}), timeout_s=0.2)
    assert not obs.available and obs.timed_out == ("nvmlInit",)
    assert [f.code for f in check_gpus(obs, PassiveThresholds())] == ["nvml.timeout", "gpu.absent"]


def test_gpu_is_lost():
    obs = collect_nvml(fake_nvml(lost=True), timeout_s=1.0)
    assert obs.gpus[0].lost
    assert [f.code for f in check_gpus(obs, PassiveThresholds())] == ["gpu.lost"]


def test_other_nvml_errors_are_warnings():
    nv = fake_nvml()
    nv.nvmlDeviceGetPcieReplayCounter = lambda h: (_ for _ in ()).throw(_err(pynvml.NVML_ERROR_UNINITIALIZED))
    obs = collect_nvml(nv, timeout_s=1.0)
    (f,) = check_gpus(obs, PassiveThresholds())
    assert f.code == "nvml.error" and "Uninitialized" in f.message


def test_call_with_timeout_propagates_errors_and_values():
    assert call_with_timeout(lambda: 3, 1.0) == 3
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 1.0)
    with pytest.raises(CallTimedOut):
        call_with_timeout(threading.Event().wait, 0.05, "wait")


def test_xid_events_from_nvml():
    obs = collect_nvml(fake_nvml(xids=(48, 13)), timeout_s=1.0, xid_wait_ms=300)
    assert obs.gpus[0].xid_events == (48, 13)
    from stalwart.health.rules import load_rules

    v = load_rules().evaluate(check_gpus(obs, PassiveThresholds()))
    assert v.status == "fail" and v.action == "drain_reset_gpu" and "Xid 48" in v.reason
    quiet = collect_nvml(fake_nvml(), timeout_s=1.0, xid_wait_ms=150)
    assert quiet.gpus[0].xid_events == () and quiet.timed_out == ()
