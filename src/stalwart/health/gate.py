"""The health gate: collect, check, decide. The agent calls :func:`run_gate` before the first start
and before every restart; the CLI's ``stalwart health check`` is the same code path.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import ConfigError
from .active import CPU_EXPECTATIONS, H100_EXPECTATIONS, ActiveExpectations, check_active, measure_active
from .findings import CheckStatus, Finding
from .gpu_fixtures import load_gpu_fixture
from .gpu_observation import GpuNodeObservation
from .infiniband import IbObservation, collect_infiniband
from .kernel_log import KernelLogObservation, collect_kernel_log, read_kernel_log_file, read_uptime
from .mounts import collect_mounts
from .nvml_collector import collect_nvml
from .passive_checks import PassiveThresholds, check_gpus, check_infiniband, check_kernel_log, check_mounts
from .rules import RuleTable, Verdict, load_rules
from .versions import NodeVersions, check_version_consistency, local_versions

KERNEL_LOG_FIXTURE = "kmsg.txt"


class GateConfig(BaseModel):
    """What the gate checks. ``fixture`` replaces every live source with recorded telemetry."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixture: Path | None = None
    expected_gpus: int | None = Field(default=None, ge=0)
    mounts: tuple[str, ...] = ()
    require_mountpoint: bool = True
    ib_sys_root: Path = Path("/sys")
    ib_rate_gbps: float | None = None
    kernel_log: str = "dmesg"  # "dmesg", a file path, or "" to skip
    xid_window_s: float = Field(default=7200.0, gt=0)  # live kernel log: XIDs older than this are history
    nvml_timeout_s: float = Field(default=5.0, gt=0)
    xid_wait_ms: int = Field(default=0, ge=0)  # listen for NVML XID events this long
    mount_timeout_s: float = Field(default=2.0, gt=0)
    rules: Path | None = None
    active: bool = False
    disk_dir: Path | None = None
    allreduce: bool = True

    @field_validator("kernel_log")
    @classmethod
    def _kernel_log_file(cls, v: str) -> str:
        if v in ("dmesg", ""):
            return v
        try:
            st = os.stat(v)
        except OSError as exc:
            raise ValueError(f"kernel log {v!r}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(
                f"kernel log {v!r} is not a regular file (a FIFO or device would hang or never end)"
            )
        return v


@dataclass(frozen=True)
class GateResult:
    passed: bool
    verdict: Verdict
    findings: tuple[Finding, ...]
    reason: str
    duration_s: float
    gpu: GpuNodeObservation | None = None
    ib: IbObservation | None = None
    timings: dict[str, float] = field(default_factory=dict)


def _kernel_log(cfg: GateConfig) -> KernelLogObservation | None:
    if cfg.fixture is not None:
        p = cfg.fixture / KERNEL_LOG_FIXTURE
        return read_kernel_log_file(p) if p.exists() else None
    if not cfg.kernel_log:
        return None
    if cfg.kernel_log == "dmesg":
        return collect_kernel_log(cfg.nvml_timeout_s)
    return read_kernel_log_file(Path(cfg.kernel_log))


def xid_cutoff(
    cfg: GateConfig, now: float, handled_before: float | None, uptime_s: float | None
) -> float | None:
    """Seconds since boot before which kernel-log XIDs are ignored (None: consider every line).

    Live logs only (recorded fixtures carry no boot time): XIDs older than ``xid_window_s``, and
    those from before ``handled_before`` (epoch; e.g. when the node was quarantined for them), are
    history. Without this a GPU reset could never be followed by a pass until the next reboot.
    """
    if cfg.fixture is not None or uptime_s is None:
        return None
    cut = uptime_s - cfg.xid_window_s
    if handled_before is not None:
        cut = max(cut, uptime_s - (now - handled_before))
    return cut


def collect_findings(
    cfg: GateConfig, clock=time.perf_counter, xid_since_boot: float | None = None, progress=None
) -> tuple[list[Finding], GpuNodeObservation, IbObservation, dict[str, float]]:
    """Passive collection + checks (and the active suite when ``cfg.active``)."""
    th = PassiveThresholds(expected_gpus=cfg.expected_gpus, ib_rate_gbps=cfg.ib_rate_gbps)
    timings: dict[str, float] = {}
    t0 = clock()
    if cfg.fixture is not None:
        if not cfg.fixture.is_dir():
            raise ConfigError(
                f"fixture directory {cfg.fixture} does not exist",
                "pass a directory with nvml_snapshot.json or nvidia-smi-q.xml",
            )
        gpu = load_gpu_fixture(cfg.fixture)
    else:
        gpu = collect_nvml(timeout_s=cfg.nvml_timeout_s, xid_wait_ms=cfg.xid_wait_ms)
    findings = check_gpus(gpu, th)
    timings["gpu"] = clock() - t0
    t0 = clock()
    klog = _kernel_log(cfg)
    if klog is not None:
        if klog.available:
            findings += check_kernel_log(klog, gpu.gpus, xid_since_boot)
        else:
            findings += [
                Finding("kernel_log", "telemetry.bad", "kernel_log", f.severity, f.message, f.evidence)
                for f in check_kernel_log(klog)
            ]
    timings["kernel_log"] = clock() - t0
    t0 = clock()
    ib_root = cfg.fixture / "sys" if cfg.fixture is not None else cfg.ib_sys_root
    ib = collect_infiniband(ib_root)
    findings += check_infiniband(ib, th)
    timings["infiniband"] = clock() - t0
    t0 = clock()
    findings += check_mounts(collect_mounts(cfg.mounts, cfg.mount_timeout_s), cfg.require_mountpoint)
    timings["mounts"] = clock() - t0
    if cfg.active:
        t0 = clock()
        m = measure_active(cfg.disk_dir, allreduce=cfg.allreduce, progress=progress)
        exp: ActiveExpectations = H100_EXPECTATIONS if m.device_kind == "cuda" else CPU_EXPECTATIONS
        findings += check_active(m, exp)
        timings["active"] = clock() - t0
        timings.update({f"active.{k}": v for k, v in m.seconds.items()})
    return findings, gpu, ib, timings


def run_gate(
    config: GateConfig,
    now: float,
    *,
    rules: RuleTable | None = None,
    node: str = "",
    peers: Sequence[NodeVersions] = (),
    handled_before: float | None = None,
    uptime_s: float | None = -1.0,
    clock=time.perf_counter,
    progress=None,
) -> GateResult:
    """Check this node now. ``passed`` is False only for a ``fail`` verdict (a warning still starts).

    ``peers``: the other nodes' :class:`NodeVersions` (e.g. exchanged through the rendezvous store);
    when given, this node fails if its driver/CUDA/NCCL/torch differs from the majority.
    ``handled_before``: epoch time before which kernel-log XIDs were already acted on (pass the
    node record's ``since`` while it is quarantined or on probation). ``uptime_s``: -1 reads /proc/uptime.
    """
    t0 = clock()
    table = rules or load_rules(config.rules)
    if uptime_s is not None and uptime_s < 0:
        uptime_s = read_uptime()
    cutoff = xid_cutoff(config, now, handled_before, uptime_s)
    findings, gpu, ib, timings = collect_findings(config, clock, cutoff, progress)
    if peers:
        me = local_versions(node or "local", driver=gpu.driver, cuda=gpu.cuda)
        findings += [f for f in check_version_consistency([*peers, me]) if f.subject == me.node]
    verdict = table.evaluate(findings)
    passed = verdict.status is not CheckStatus.FAIL
    dur = clock() - t0
    reason = ("gate passed: " if passed else "gate failed: ") + verdict.reason
    return GateResult(passed, verdict, tuple(findings), reason, dur, gpu, ib, timings)
