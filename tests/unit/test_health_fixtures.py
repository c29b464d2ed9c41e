"""Every passive check driven from recorded H100 telemetry and the fault variants derived from it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stalwart.health import GateConfig, run_gate
from stalwart.health.gpu_fixtures import load_gpu_fixture, load_nvml_snapshot, load_series_csv, load_smi_xml
from stalwart.health.passive_checks import PassiveThresholds, check_gpus

FIX = Path(__file__).parent.parent / "fixtures" / "gpu"
REAL = FIX / "h100"
DERIVED = FIX / "h100_derived"


def gate(d: Path, expected: int | None = 1):
    return run_gate(GateConfig(fixture=d, expected_gpus=expected), now=time.time())


def test_real_snapshot_is_read_faithfully():
    obs = load_nvml_snapshot(REAL / "nvml_snapshot.json")
    assert obs.available and obs.driver == "580.159.04" and obs.cuda == "13.0"
    (g,) = obs.gpus
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert (g.temp_slowdown, g.temp_shutdown, g.temp_gpu_max, g.temp_mem_max) == (89, 95, 87, 95)
    assert (g.pcie_gen, g.pcie_width, g.pcie_max_gen, g.pcie_max_width) == (5, 16, 5, 16)
    assert g.remap_pending is False and g.remap_failure is False
    assert g.clock_event_reasons == 1  # idle
    assert g.errors == ()  # NotSupported (retired pages on Hopper) is not an error


def test_real_xml_agrees_with_snapshot():
    x = load_smi_xml(REAL / "nvidia-smi-q.xml")
    s = load_nvml_snapshot(REAL / "nvml_snapshot.json")
    assert x.problems == () and x.driver == s.driver and x.cuda == s.cuda
    gx, gs = x.gpus[0], s.gpus[0]
    for f in ("uuid", "temp_gpu", "pcie_gen", "pcie_width", "remap_pending", "ecc_vol_uncorr"):
        assert getattr(gx, f) == getattr(gs, f), f


def test_real_gemm_burn_has_no_fault_finding():
    samples, problems = load_series_csv(REAL / "h100_gemm_burn_telemetry.csv")
    assert problems == () and len(samples) == 360
    # the recording really is under load with SW power cap set: the check must tolerate it
    assert sum(1 for s in samples if s.clock_event_reasons == 4) > 250
    obs = load_gpu_fixture(REAL)
    assert len(obs.series) == 360
    findings = check_gpus(obs, PassiveThresholds(expected_gpus=1))
    assert findings == []
    r = gate(REAL)
    assert r.passed and r.verdict.status == "pass"


CASES = {
    # variant: (verdict, a finding code that must be there, action, recoverable)
    "xid79_kmsg": ("fail", "gpu.xid", "drain_power_cycle", False),
    "xid48_kmsg": ("fail", "gpu.xid", "drain_reset_gpu", True),
    "xid13_kmsg": ("pass", "gpu.xid", "none", True),
    "remap_pending": ("fail", "gpu.remap.pending", "drain_reset_gpu", True),
    "remap_failure": ("fail", "gpu.remap.failure", "drain_rma", False),
    "ecc_uncorrectable": ("fail", "gpu.ecc.uncorrectable", "drain_reset_gpu", True),
    "pcie_x8": ("fail", "gpu.pcie.degraded", "drain_reboot", True),
    "hot_snapshot": ("fail", "gpu.temp.slowdown", None, False),
    "gpu_lost": ("fail", "gpu.lost", "drain_power_cycle", False),
    "nvlink_errors": ("fail", "gpu.nvlink.errors", "drain_reset_gpu", True),
    "burn_hw_thermal": ("fail", "gpu.clock.hw_thermal", None, False),
    "burn_power_brake": ("fail", "gpu.clock.power_brake", "drain_inspect_power", False),
    "burn_pcie_replays": ("warn", "gpu.pcie.replay_rate", "watch", True),
    "garbage_kmsg": ("warn", "telemetry.bad", "investigate", True),
    "truncated_xml": ("warn", "telemetry.bad", "investigate", True),
    "truncated_json": ("warn", "telemetry.bad", "investigate", True),
    "truncated_csv": ("warn", "telemetry.bad", "investigate", True),
    "healthy_burn": ("pass", None, "none", True),
}


@pytest.mark.parametrize("variant", sorted(CASES))
def test_derived_variant(variant):
    status, code, action, recoverable = CASES[variant]
    r = gate(DERIVED / variant)
    assert r.verdict.status == status, r.verdict.reason
    assert r.passed == (status != "fail")
    if code:
        assert code in {f.code for f in r.findings}, [f.code for f in r.findings]
    if action:
        assert r.verdict.action == action
    assert r.verdict.recoverable == recoverable


def test_xid_lines_name_the_gpu_and_carry_evidence():
    r = gate(DERIVED / "xid79_kmsg")
    (f,) = [f for f in r.findings if f.code == "gpu.xid"]
    assert f.subject == "gpu0" and f.evidence["xid"] == 79 and f.evidence["count"] == 2  # both line formats
    assert "79" in r.verdict.reason and "[irrecoverable]" in r.verdict.reason


def test_bad_telemetry_never_claims_gpus_are_gone():
    # unreadable telemetry with 8 GPUs expected: a finding of its own, not "0 of 8 GPUs" -> drain
    r = gate(DERIVED / "truncated_json", expected=8)
    assert {f.code for f in r.findings} == {"telemetry.bad"}


def test_missing_gpu_is_counted_when_expected():
    r = gate(REAL, expected=8)
    (f,) = [f for f in r.findings if f.code == "gpu.count"]
    assert f.evidence == {"expected": 8, "found": 1}
    assert not r.passed


def test_no_gpu_is_a_normal_reported_case():
    r = gate(DERIVED / "no_gpu", expected=None)
    assert r.passed and r.verdict.status == "pass"
    assert "LibraryNotFound" in r.verdict.reason


def test_sw_power_cap_alone_is_not_a_fault_but_hw_bits_are():
    from dataclasses import replace

    g = load_nvml_snapshot(REAL / "nvml_snapshot.json")
    th = PassiveThresholds()
    capped = replace(g, gpus=(replace(g.gpus[0], clock_event_reasons=0x4),))
    assert check_gpus(capped, th) == []
    for bit, code in (
        (0x8, "gpu.clock.hw_slowdown"),
        (0x40, "gpu.clock.hw_thermal"),
        (0x80, "gpu.clock.power_brake"),
    ):
        bad = replace(g, gpus=(replace(g.gpus[0], clock_event_reasons=0x4 | bit),))
        assert [f.code for f in check_gpus(bad, th)] == [code]


def test_single_hw_slowdown_blip_in_a_burn_is_tolerated():
    from dataclasses import replace

    obs = load_gpu_fixture(REAL)
    series = list(obs.series)
    i = next(i for i, s in enumerate(series) if s.phase == "gemm_burn" and s.t > 20)
    series[i] = replace(series[i], clock_event_reasons=0x8 | 0x4)
    assert check_gpus(replace(obs, series=tuple(series)), PassiveThresholds()) == []
