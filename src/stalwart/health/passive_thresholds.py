"""Thresholds of the passive checks (defaults from DCGM and AzNHC), and the one way they make a finding."""

from __future__ import annotations

from dataclasses import dataclass

from .findings import Finding, Severity


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


def finding(
    code: str, subject: str, sev: Severity, msg: str, check: str = "gpu", **evidence: object
) -> Finding:
    return Finding(check=check, code=code, subject=subject, severity=sev, message=msg, evidence=evidence)
