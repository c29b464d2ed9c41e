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
