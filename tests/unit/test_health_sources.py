"""Kernel log, InfiniBand sysfs, mounts and version consistency."""

from __future__ import annotations

import threading
from pathlib import Path

from stalwart.health.active import CPU_EXPECTATIONS, ActiveMeasurements, check_active
from stalwart.health.infiniband import collect_infiniband
from stalwart.health.kernel_log import normalise_bdf, parse_kernel_log
from stalwart.health.mounts import collect_mount
from stalwart.health.passive_checks import PassiveThresholds, check_infiniband, check_kernel_log, check_mounts
from stalwart.health.versions import NodeVersions, check_version_consistency, local_versions


def test_kernel_log_formats():
    text = "\n".join(
        [
            "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
            "NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000101",
            "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
            "NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:2330) has fallen off the bus and is not responding",
            "eth0: link up",
        ]
    )
    k = parse_kernel_log(text)
    assert [(x.bdf, x.xid) for x in k.xids] == [
        ("0000:2b:00", 79),
        ("0000:01:00", 31),
        ("0000:10:1c", 63),
        ("0000:18:00", 79),
    ]
    assert k.problems == ()


def test_kernel_log_garbage_is_a_finding():
    k = parse_kernel_log("\ufffd\ufffd\nNVRM: Xid (PCI:0000:2b:00): x9, oops\nNVRM: Xid broken")
    fs = check_kernel_log(k)
    assert {f.code for f in fs} == {"telemetry.bad"} and len(fs) == 3


def test_bdf_normalisation_joins_nvml_and_kernel_ids():
    assert normalise_bdf("00000000:18:00.0") == normalise_bdf("0000:18:00") == "0000:18:00"


def _port(
    root: Path,
    dev: str,
    port: int,
    state="4: ACTIVE",
    phys="5: LinkUp",
    rate="400 Gb/sec (4X NDR)",
    **counters: int,
) -> None:
    p = root / "class" / "infiniband" / dev / "ports" / str(port)
    (p / "counters").mkdir(parents=True)
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text(phys + "\n")
    (p / "rate").write_text(rate + "\n")
    (p / "link_layer").write_text("InfiniBand\n")
    for name in ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors"):
        (p / "counters" / name).write_text(f"{counters.get(name, 0)}\n")


def test_infiniband_sysfs(tmp_path):
    _port(tmp_path, "mlx5_0", 1)
    _port(tmp_path, "mlx5_1", 1, state="1: DOWN", phys="2: Polling")
    _port(tmp_path, "mlx5_2", 1, rate="200 Gb/sec (4X HDR)", symbol_error=65535)
    ib = collect_infiniband(tmp_path)
    assert [p.name for p in ib.ports] == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1"]
    assert ib.ports[0].rate_gbps == 400 and ib.ports[1].state == "DOWN"
    fs = check_infiniband(ib, PassiveThresholds(ib_rate_gbps=400))
    got = {(f.subject, f.code) for f in fs}
    assert got == {
        ("mlx5_1/1", "ib.state"),
        ("mlx5_1/1", "ib.phys_state"),
        ("mlx5_2/1", "ib.rate"),
        ("mlx5_2/1", "ib.counter_saturated"),
    }


def test_infiniband_link_downed_delta(tmp_path):
    _port(tmp_path / "a", "mlx5_0", 1, link_downed=1)
    _port(tmp_path / "b", "mlx5_0", 1, link_downed=3)
    before, after = collect_infiniband(tmp_path / "a"), collect_infiniband(tmp_path / "b")
    fs = check_infiniband(after, PassiveThresholds(), previous=before)
    assert [(f.code, f.evidence["delta"]) for f in fs] == [("ib.link_downed", 2)]


def test_infiniband_garbage_and_absence(tmp_path):
    assert collect_infiniband(tmp_path).ports == ()
    _port(tmp_path, "mlx5_0", 1, rate="fast")
    (tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors").write_text("\x00\x01")
    fs = check_infiniband(collect_infiniband(tmp_path), PassiveThresholds())
    assert [f.code for f in fs] == ["telemetry.bad", "telemetry.bad"]


def test_mounts(tmp_path):
    ms = (collect_mount("/"), collect_mount(str(tmp_path)), collect_mount(str(tmp_path / "nope")))
    fs = check_mounts(ms)
    assert [(f.subject, f.code) for f in fs] == [
        (str(tmp_path), "mount.not_mounted"),
        (str(tmp_path / "nope"), "mount.missing"),
    ]


def test_hung_stat_is_a_finding(monkeypatch):
    import stalwart.health.mounts as mounts

    block = threading.Event()
    monkeypatch.setattr(mounts.os.path, "exists", lambda p: block.wait() or True)
    m = collect_mount("/hung/nfs", timeout_s=0.1)
    assert m.timed_out
    assert [f.code for f in check_mounts((m,))] == ["mount.hung"]


def test_version_consistency():
    reps = [
        NodeVersions("a", "580.1", "13.0", "2.27", "2.13"),
        NodeVersions("b", "580.1", "13.0", "2.27", "2.13"),
        NodeVersions("c", "575.9", "13.0", "2.27", "2.12"),
    ]
    fs = check_version_consistency(reps)
    assert {(f.subject, f.code) for f in fs} == {("c", "versions.driver"), ("c", "versions.torch")}
    assert check_version_consistency(reps[:2]) == []
    assert local_versions("me").torch  # torch is installed here


def test_active_checks_judge_measurements():
    good = ActiveMeasurements("cpu", {"cpu": 0.02}, {"cpu": 5.0}, 0.5, 2, 0.3, True, "loss 1 -> 0.9")
    fs = check_active(good, CPU_EXPECTATIONS)
    assert all(f.severity.name == "OK" for f in fs) and len(fs) == 5
    slow = ActiveMeasurements(
        "cuda",
        {"cuda:0": 700.0, "cuda:1": 720.0, "cuda:2": 500.0},
        {},
        None,
        0,
        None,
        False,
        "loss nan",
        ("allreduce: timed out",),
    )
    from stalwart.health.active import H100_EXPECTATIONS

    codes = [(f.subject, f.code) for f in check_active(slow, H100_EXPECTATIONS)]
    assert ("cuda:2", "active.gemm.low") in codes
    assert ("model", "active.train_step.failed") in codes and ("allreduce", "active.error") in codes
    # a device that meets the floor but lags the node's best is caught too
    lag = ActiveMeasurements("cuda", {"cuda:0": 720.0, "cuda:1": 600.0}, {}, None, 0, None, None)
    assert [
        (f.subject, f.code) for f in check_active(lag, H100_EXPECTATIONS) if f.severity.name == "FAIL"
    ] == [("cuda:1", "active.gemm.slowest")]


def test_gate_compares_versions_with_peers():
    import time

    import torch

    from stalwart.health import GateConfig, run_gate

    fix = Path(__file__).parent.parent / "fixtures" / "gpu" / "h100"
    same = [NodeVersions(f"p{i}", "580.159.04", "13.0", "", torch.__version__) for i in range(3)]
    r = run_gate(GateConfig(fixture=fix), time.time(), node="me", peers=same)
    assert r.passed
    old = [NodeVersions(f"p{i}", "575.57.08", "13.0", "", torch.__version__) for i in range(3)]
    r = run_gate(GateConfig(fixture=fix), time.time(), node="me", peers=old)
    assert not r.passed and [f.code for f in r.findings] == ["versions.driver"]
    assert "580.159.04 differs from 575.57.08" in r.verdict.reason


def test_old_xids_are_history_and_handled_ones_do_not_block_readmission(tmp_path):
    import time

    from stalwart.health import GateConfig, run_gate

    log = tmp_path / "kern.log"
    log.write_text(
        "[  100.000000] NVRM: Xid (PCI:0000:00:06): 48, pid=1, DBE\n"
        "[ 9000.500000] NVRM: Xid (PCI:0000:00:06): 13, pid=2, Graphics Exception\n"
    )
    k = parse_kernel_log(log.read_text())
    assert [x.t_boot for x in k.xids] == [100.0, 9000.5]
    assert [f.evidence["xid"] for f in check_kernel_log(k, since_boot_s=5000.0)] == [13]
    cfg = GateConfig(kernel_log=str(log), xid_window_s=7200)
    now = 1_000_000.0
    # uptime 9100 s: the Xid 48 at t=100 s is 9000 s old, outside the 2 h window
    r = run_gate(cfg, now, uptime_s=9100.0)
    assert r.passed and "gpu.xid" in {f.code for f in r.findings}  # only the (application) Xid 13
    # uptime 3600 s: inside the window -> fail ...
    log.write_text("[  100.000000] NVRM: Xid (PCI:0000:00:06): 48, pid=1, DBE\n")
    assert not run_gate(cfg, now, uptime_s=3600.0).passed
    # ... unless the node was quarantined for it (handled at t=now-3000, i.e. boot+600 s)
    assert run_gate(cfg, now, uptime_s=3600.0, handled_before=now - 3000).passed
    # a fresh Xid after the quarantine still fails
    log.write_text("[ 3500.000000] NVRM: Xid (PCI:0000:00:06): 48, pid=1, DBE\n")
    assert not run_gate(cfg, now, uptime_s=3600.0, handled_before=now - 3000).passed
    # recorded fixtures have no boot clock: every line counts
    assert (
        run_gate(
            GateConfig(fixture=Path(__file__).parent.parent / "fixtures/gpu/h100_derived/xid48_kmsg"),
            time.time(),
            uptime_s=10**7,
        ).passed
        is False
    )
