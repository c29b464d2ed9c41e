"""Hang detection without the SDK: per-rank CPU progress (collector state) and the stall policy (pure)."""

from __future__ import annotations

import os

from stalwart.launch.cpu_progress import CpuProgress, ProcSample, detect_cpu_stall, read_proc

T0 = 1000.0


def feed(samples: dict[int, list[tuple[float, str, float]]]) -> dict[int, CpuProgress]:
    """samples: rank -> [(t, state, cpu_s), ...]"""
    out = {}
    for rank, rows in samples.items():
        p = CpuProgress(since=T0)
        for t, state, cpu in rows:
            p.observe(ProcSample(state, cpu), t)
        out[rank] = p
    return out


def test_read_proc_sees_this_process_running_and_burning_cpu():
    s = read_proc(os.getpid())
    assert s is not None and s.state in ("R", "S") and s.cpu_s > 0
    assert read_proc(2**22 + 12345) is None  # no such process


def test_a_busy_rank_and_a_waiting_rank_is_not_a_hang():
    # rank 0 evaluates (CPU grows), rank 1 waits in a collective (measured: 0.02 s CPU in 5 s)
    ranks = feed(
        {
            0: [(T0 + t, "R", 1.0 + 0.9 * t) for t in range(0, 61)],
            1: [(T0 + t, "S", 1.0 + 0.004 * t) for t in range(0, 61)],
        }
    )
    assert detect_cpu_stall(ranks, T0 + 60, 30.0) is None


def test_all_ranks_idle_blames_the_one_that_went_idle_first():
    ranks = feed(
        {
            0: [(T0, "S", 1.0), (T0 + 10, "S", 5.0), (T0 + 50, "S", 5.01)],  # idle since 10
            1: [(T0, "R", 1.0), (T0 + 4, "S", 3.0), (T0 + 50, "S", 3.0)],
        }
    )  # idle since 4
    assert detect_cpu_stall(ranks, T0 + 30, 30.0) is None  # rank 0 made progress 20 s ago
    v = detect_cpu_stall(ranks, T0 + 41, 30.0)
    assert v is not None and v.culprit == 1 and v.onset == T0 + 4 and "every rank" in v.evidence


def test_a_stopped_rank_is_the_culprit_even_while_others_spin():
    ranks = feed(
        {
            0: [(T0 + t, "R", 1.0 + t) for t in range(0, 12)],  # spinning, e.g. a busy-wait
            1: [(T0, "R", 1.0), (T0 + 2, "T", 2.0), (T0 + 11, "T", 2.0)],
        }
    )
    assert detect_cpu_stall(ranks, T0 + 11, 10.0) is None  # stopped at 2 s: 9 s so far
    v = detect_cpu_stall(ranks, T0 + 12.5, 10.0)
    assert v is not None and v.culprit == 1 and "state T" in v.evidence


def test_background_threads_of_an_idle_rank_are_not_progress():
    # 1% CPU in background threads: below the 2% + 50 ms bar, the rank stays stalled
    ranks = feed({0: [(T0 + t, "S", 1.0 + 0.01 * t) for t in range(0, 41)]})
    v = detect_cpu_stall(ranks, T0 + 40, 30.0)
    assert v is not None and v.stalled_s == 40.0


def test_a_stopped_rank_has_its_own_shorter_limit_idleness_the_long_one():
    ranks = feed(
        {
            0: [(T0, "S", 1.0), (T0 + 50, "S", 1.0)],  # waiting in a collective: idle, not stopped
            1: [(T0, "R", 1.0), (T0 + 2, "T", 2.0), (T0 + 50, "T", 2.0)],
        }
    )
    v = detect_cpu_stall(ranks, T0 + 12.5, 600.0, stopped_s=10.0)
    assert v is not None and v.culprit == 1 and "timeout 10.00s" in v.evidence


def test_a_healthy_low_cpu_job_is_not_hung_within_the_process_group_timeout():
    # one tiny all-reduce every 0.5 s: no rank ever passes the CPU bar, both are only waiting
    from stalwart.launch.attempt.hang_monitor import HangMonitor
    from stalwart.launch.attempt.monitors import default_monitors
    from stalwart.settings.run_config import RunConfig
    from stalwart.settings.schema import HangSettings

    def stall_of(**hang) -> float:
        cfg = RunConfig(script="train.py", hang=HangSettings(**hang))
        return next(m for m in default_monitors(cfg) if isinstance(m, HangMonitor)).cpu_stall_s

    stall = stall_of()
    assert stall == HangSettings().pg_timeout_s  # the default: the process-group timeout
    assert stall_of(pg_timeout_s=450.0) == 450.0
    assert stall_of(cpu_stall_s=7.0) == 7.0  # set explicitly: taken as given
    ticks = [T0 + 0.5 * i for i in range(int(stall * 2) + 1)]
    ranks = feed({r: [(t, "S", 1.0 + 0.0004 * (t - T0)) for t in ticks] for r in (0, 1)})
    assert detect_cpu_stall(ranks, T0 + stall - 1.0, stall, stopped_s=10.0) is None
    assert detect_cpu_stall(ranks, T0 + stall, stall, stopped_s=10.0) is not None  # then it is


def test_the_hang_monitor_catches_a_stopped_unhooked_rank_at_the_floor_but_not_idle_ones():
    from stalwart.launch.attempt.hang_monitor import HangMonitor
    from stalwart.launch.snapshot import CpuMark, RankView, Snapshot
    from stalwart.policy.timeouts import HangTimeoutPolicy

    mon = HangMonitor(HangTimeoutPolicy(floor_s=10.0), 300.0, 600.0)

    def snap(now, cpu):
        ranks = (RankView(0, T0), RankView(1, T0))
        return Snapshot(
            now=now, tick=0.5, node="n0", started=T0, ranks=ranks, codes={0: None, 1: None}, cpu=cpu
        )

    idle = {0: CpuMark(T0), 1: CpuMark(T0)}
    assert mon(snap(T0 + 590, idle)) is None  # idle for ten minutes less a bit: no evidence
    stopped = {0: CpuMark(T0), 1: CpuMark(T0 + 5, "T")}
    assert mon(snap(T0 + 14, stopped)) is None
    d = mon(snap(T0 + 15, stopped))
    assert d is not None and d.rank == 1 and "stopped" in d.reason
