"""Severe GPU Xids since the attempt started (launch/gpu_faults.py), the in-place ladder's input."""

from __future__ import annotations

import dataclasses

from stalwart.launch.gpu_faults import XidWatch, severe_codes, severe_xids
from stalwart.policy.inplace import InPlaceCase, NotInPlace, decide
from stalwart.policy.vocabulary import FailureKind

LOG = (
    "[  100.000000] NVRM: Xid (PCI:0000:2b:00): 79, pid=1, GPU has fallen off the bus.",
    "[  500.000000] NVRM: Xid (PCI:0000:2b:00): 13, pid=7, Graphics Exception",
    "[  600.250000] NVRM: Xid (PCI:0000:3c:00): 48, pid=9, An uncorrectable double bit error",
    "NVRM: Xid (PCI:0000:4d:00): 79, undated line",
)


def test_only_reset_or_power_cycle_xids_count():
    codes = severe_codes()
    assert {48, 79, 64, 74} <= codes and not {13, 43, 92} & codes


def test_only_xids_stamped_since_the_attempt_started_are_severe_faults_of_it():
    got = severe_xids(LOG, since_boot_s=400.0, severe=severe_codes())
    assert got == ("GPU 0000:3c:00 reported Xid 48 (pid=9, An uncorrectable double bit error)",)
    assert len(severe_xids(LOG, since_boot_s=0.0, severe=severe_codes())) == 2  # 79 and 48, 13 is the app's


def test_the_watch_places_the_attempt_start_on_the_kernel_clock():
    # booted at wall time 10_000; the attempt started at 10_550 = 550 s after boot
    watch = XidWatch(10_550.0, None, now=lambda: 10_700.0, uptime=lambda: 700.0, read=lambda path: LOG)
    assert [x.split(" reported")[0] for x in watch()] == ["GPU 0000:3c:00"]
    late = XidWatch(10_650.0, None, now=lambda: 10_700.0, uptime=lambda: 700.0, read=lambda path: LOG)
    assert late() == ()
    assert XidWatch(1.0, None, uptime=lambda: None, read=lambda path: LOG)() == ()  # no kernel clock


def test_a_severe_xid_sends_the_failure_down_the_ladder_with_the_gpu_named():
    case = InPlaceCase(
        enabled=True,
        failure=FailureKind.CRASH,
        failed=frozenset({1}),
        ranks=frozenset({0, 1}),
        in_place_ranks=frozenset({0, 1}),
        num_nodes=1,
        used=0,
        allowed=3,
        generation=0,
    )
    assert not isinstance(decide(case), NotInPlace)
    got = decide(dataclasses.replace(case, xids=("GPU 0000:3c:00 reported Xid 48 (DBE)",)))
    assert isinstance(got, NotInPlace)
    assert "GPU 0000:3c:00 reported Xid 48" in got.reason and "health gate" in got.reason


def test_the_agent_reads_the_configured_kernel_log_from_the_attempts_start(tmp_path):
    import time
    from types import SimpleNamespace

    from stalwart.health.kernel_log import read_uptime
    from stalwart.launch.clock import ManualClock
    from stalwart.launch.fakes import RecordingLedger
    from stalwart.launch.inplace.recovery import InPlaceRecovery

    up = read_uptime()
    assert up is not None
    log = tmp_path / "kern.log"
    log.write_text(
        f"[{up - 3600:12.6f}] NVRM: Xid (PCI:0000:2b:00): 79, before the attempt\n"
        f"[{up + 1:12.6f}] NVRM: Xid (PCI:0000:3c:00): 74, NVLink error during it\n"
    )
    rec = InPlaceRecovery(
        cfg=SimpleNamespace(diagnosis=SimpleNamespace(kernel_log=log)),
        ledger=RecordingLedger(),
        group=None,
        receiver=None,
        block=None,
        tracker=None,  # type: ignore[arg-type]
        num_nodes=1,
        attempt=0,
        clock=ManualClock(time.time() - 1),  # the attempt started a second ago
    )
    assert rec.xids is not None
    assert [x.split(" reported")[0] for x in rec.xids()] == ["GPU 0000:3c:00"]
