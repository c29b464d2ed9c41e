from stalwart.diagnose.straggler import slow_spans
from stalwart.events import StepCompleted
from stalwart.launch.console import innermost_frame


def _steps(slow_rank: int, slow_from: int, slow_to: int, n: int = 100, ranks: int = 4):
    out = []
    for step in range(n):
        for r in range(ranks):
            own = 0.030 if not (r == slow_rank and slow_from <= step <= slow_to) else 0.060
            # the others wait for the slow rank inside backward: equal step time on every rank
            wait = 0.060 - own if slow_from <= step <= slow_to else 0.0
            out.append(
                StepCompleted(
                    ts=step + 0.1,
                    rank=r,
                    step=step,
                    start=float(step),
                    duration=own + 0.01 + wait,
                    sections={"forward": own, "backward": 0.01 + wait},
                )
            )
    return out


def test_a_rank_slow_for_part_of_the_run_is_found_with_its_span():
    spans = slow_spans(_steps(slow_rank=2, slow_from=40, slow_to=59), window=20)
    assert len(spans) == 1
    sp = spans[0]
    assert (sp.rank, sp.first_step, sp.last_step) == (2, 40, 59)
    assert 1.9 < sp.score < 2.1


def test_two_separate_spans_stay_separate_and_a_uniform_fleet_has_none():
    steps = _steps(1, 0, 19) + [s for s in _steps(1, 60, 79) if s.step >= 40]
    steps = [s for s in steps if s.step < 20 or s.step >= 40]
    spans = slow_spans(steps, window=20)
    assert [(s.first_step, s.last_step) for s in spans] == [(0, 19), (60, 79)]
    assert slow_spans(_steps(0, -1, -1), window=20) == ()


def test_innermost_frame_is_taken_from_the_interrupted_thread():
    dump = """Thread 0x00007f (most recent call first):
  File "/usr/lib/python3.11/concurrent/futures/thread.py", line 81 in _worker

Current thread 0x00007e (most recent call first):
  File "/src/stalwart/train/session.py", line 305 in _inject
  File "/src/train.py", line 10 in main
"""
    assert innermost_frame(dump) == 'File "/src/stalwart/train/session.py", line 305 in _inject'
    assert innermost_frame("garbage") == "(no Python frame)"


def test_innermost_frame_of_a_stopped_rank_comes_from_py_spys_main_thread():
    dump = """(stopped, state T: read from outside by py-spy dump --nonblocking)
Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4250 (idle): "pt_autograd_0"
    wait (threading.py:320)
Thread 4242 (idle): "MainThread"
    forward (train.py:31)
    main (train.py:52)
"""
    assert innermost_frame(dump) == "forward (train.py:31) (py-spy)"
    assert innermost_frame('Thread 7 (idle): "MainThread"\n') == "(no Python frame)"
