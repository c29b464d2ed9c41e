"""ProgressTracker (the agent's view of each rank) and detect_hang (pure, time injected)."""

from __future__ import annotations

import json

from stalwart import protocol
from stalwart.launch.progress import ProgressTracker, detect_hang

T0 = 1000.0


def observe(tr: ProgressTracker, wire: dict, now: float):
    """Feed the tracker the record a worker would send (its wire form; "t" defaults to arrival)."""
    if wire["k"] == "done":
        msg = protocol.StepDone(wire["r"], wire["s"], wire["t0"], wire["d"], wire.get("sec", {}))
    else:
        defaults = {"t": now, "pre": False} if wire["k"] == "fin" else {"t": now}
        msg = protocol.decode(json.dumps({**defaults, **wire}).encode())
    assert msg is not None, wire
    return tr.observe(msg, now)


def tracker(ranks=(0, 1)) -> ProgressTracker:
    return ProgressTracker(ranks=list(ranks), started=T0)


def test_observe_updates_rank_state_and_returns_step_records():
    tr = tracker()
    assert observe(tr, {"k": "start", "r": 0, "s": 4, "n": 20}, T0 + 0.1) is None
    assert tr.first_step == 4 and tr.total_steps == 20
    observe(tr, {"k": "step", "r": 0, "s": 4, "t": T0 + 0.2}, T0 + 0.2)
    observe(tr, {"k": "sec", "r": 0, "n": "forward", "s": 4}, T0 + 0.3)
    p = tr.progress[0]
    assert (p.step, p.section, p.last_msg) == (4, "forward", T0 + 0.3)
    rec = observe(
        tr, {"k": "done", "r": 0, "s": 4, "t0": T0 + 0.2, "d": 0.5, "sec": {"forward": 0.3}}, T0 + 0.7
    )
    assert rec is not None and (rec.rank, rec.step, rec.start, rec.duration) == (0, 4, T0 + 0.2, 0.5)
    assert rec.sections == {"forward": 0.3}
    assert p.section is None and p.done_steps == 1 and list(tr.step_times) == [0.5]
    assert tr.max_done_step == 4 and tr.steps_seen()
    assert tr.max_step_in_progress() == 4
    # rank 1 has said nothing: still at its start-up state
    assert tr.progress[1].step == -1 and tr.progress[1].last_msg == T0


def test_unknown_rank_is_ignored():
    tr = tracker()
    assert observe(tr, {"k": "done", "r": 7, "s": 1, "t0": 0.0, "d": 1.0}, T0 + 1) is None
    assert not tr.steps_seen() and len(tr.step_times) == 0


def test_checkpoint_time_is_measured_from_section_to_commit():
    tr = tracker()
    observe(tr, {"k": "sec", "r": 0, "n": "checkpoint", "s": 10}, T0 + 10.0)
    assert tr.progress[0].in_checkpoint
    observe(tr, {"k": "ckpt", "r": 0, "s": 10}, T0 + 12.5)
    assert list(tr.ckpt_times) == [2.5] and not tr.progress[0].in_checkpoint


def test_a_rank_past_its_last_step_or_its_final_save_is_wrapping_up():
    tr = tracker()
    observe(tr, {"k": "start", "r": 0, "s": 0, "n": 3}, T0)
    observe(tr, {"k": "start", "r": 1, "s": 0, "n": 3}, T0)
    observe(tr, {"k": "done", "r": 0, "s": 1, "t0": T0, "d": 0.5}, T0 + 1)
    assert not tr.progress[0].loop_done  # step 1 of 0..2: still in the loop
    observe(tr, {"k": "done", "r": 0, "s": 2, "t0": T0 + 1, "d": 0.5}, T0 + 2)
    assert tr.progress[0].loop_done and not tr.progress[1].loop_done
    # the final save says so too (a script whose loop the tracker did not see announced)
    observe(tr, {"k": "ckpt", "r": 1, "s": 3, "ok": True, "kind": "final"}, T0 + 3)
    assert tr.progress[1].loop_done
    # an emergency save is not the end of the loop; a new loop (next attempt's tracker) starts afresh
    tr2 = tracker()
    observe(tr2, {"k": "ckpt", "r": 0, "s": 2, "ok": True, "kind": "emergency"}, T0 + 3)
    assert not tr2.progress[0].loop_done


def test_fin_and_signals():
    tr = tracker()
    observe(tr, {"k": "fin", "r": 1, "s": 9, "pre": True}, T0 + 1)
    observe(tr, {"k": "fin", "r": 0, "s": 9, "pre": False}, T0 + 1)
    observe(tr, {"k": "sig", "r": 0, "sig": 15}, T0 + 2)
    assert tr.progress[1].finished and tr.preempted_ranks == {1} and tr.signals == [15]


def test_no_hang_before_the_timeout():
    tr = tracker()
    observe(tr, {"k": "step", "r": 0, "s": 3}, T0 + 5)
    observe(tr, {"k": "step", "r": 1, "s": 3}, T0 + 5)
    assert detect_hang(tr, T0 + 14.99, 10.0, "training") is None
    v = detect_hang(tr, T0 + 15.0, 10.0, "training")
    assert v is not None and v.silence_s == 10.0


def test_silent_rank_is_the_culprit_with_onset_at_its_last_message():
    tr = tracker((0, 1, 2))
    for r in (0, 1, 2):
        observe(tr, {"k": "step", "r": r, "s": 5}, T0 + 1)
    observe(tr, {"k": "sec", "r": 1, "n": "forward", "s": 5}, T0 + 2)  # rank 1 goes quiet here
    observe(tr, {"k": "sec", "r": 0, "n": "backward", "s": 5}, T0 + 2.5)
    observe(tr, {"k": "sec", "r": 2, "n": "backward", "s": 5}, T0 + 2.6)
    v = detect_hang(tr, T0 + 13.0, 10.0, "training")
    assert v is not None
    assert v.culprit == 1 and v.onset == T0 + 2 and v.step == 5 and v.timeout_s == 10.0
    assert v.silence_s == 11.0
    assert "rank 1 silent 11.00s at step 5, section 'forward'" in v.evidence
    assert "others at step 5 'backward'" in v.evidence and "training" in v.evidence


def test_least_advanced_rank_is_blamed_even_if_it_spoke_last():
    # rank 0 waits in the all-reduce of step 8 (silent longest); rank 1 is stuck in data loading
    tr = tracker()
    observe(tr, {"k": "sec", "r": 0, "n": "backward", "s": 8}, T0 + 1)
    observe(tr, {"k": "step", "r": 1, "s": 8}, T0 + 1.5)
    observe(tr, {"k": "sec", "r": 1, "n": "data", "s": 8}, T0 + 2)
    tr.progress[0].step = 8
    v = detect_hang(tr, T0 + 11.5, 10.0, "training")
    assert v is not None and v.culprit == 1 and v.onset == T0 + 2


def test_rank_behind_by_a_step_is_the_culprit():
    tr = tracker()
    observe(tr, {"k": "step", "r": 1, "s": 11}, T0)
    observe(tr, {"k": "done", "r": 1, "s": 11, "t0": T0, "d": 2.0}, T0 + 2)
    observe(tr, {"k": "step", "r": 0, "s": 12}, T0 + 3)
    v = detect_hang(tr, T0 + 20, 10.0, "training")
    assert v is not None and v.culprit == 1 and v.step == 11


def test_finished_ranks_are_never_hung():
    tr = tracker()
    for r in (0, 1):
        observe(tr, {"k": "fin", "r": r, "s": 10}, T0 + 1)
    assert detect_hang(tr, T0 + 1e6, 10.0, "training") is None
    tr = tracker()
    observe(tr, {"k": "fin", "r": 0, "s": 10}, T0 + 1)
    observe(tr, {"k": "step", "r": 1, "s": 9}, T0 + 2)
    v = detect_hang(tr, T0 + 30, 10.0, "training")
    assert v is not None and v.culprit == 1


def test_startup_silence_names_start_up():
    tr = tracker()
    for r in (0, 1):  # the workers announced the SDK, then went quiet
        observe(tr, {"k": "hello", "r": r, "t": T0}, T0)
    v = detect_hang(tr, T0 + 301, 300.0, "start-up")
    assert v is not None and "at start-up" in v.evidence and v.step == -1 and "start-up)" in v.evidence


def test_workers_without_the_sdk_are_never_hung_by_silence():
    tr = tracker()  # a script that never imports the SDK sends nothing at all
    assert tr.sdk_ranks() == []
    assert detect_hang(tr, T0 + 10_000, 300.0, "start-up") is None
    observe(tr, {"k": "hello", "r": 1, "t": T0 + 5}, T0 + 5)  # only rank 1 uses the SDK
    v = detect_hang(tr, T0 + 306, 300.0, "start-up")
    assert v is not None and v.culprit == 1


def test_a_long_phase_on_one_rank_is_not_a_hang_of_the_waiting_ranks():
    tr = tracker()
    for r in (0, 1):
        observe(tr, {"k": "step", "r": r, "s": 9}, T0)
    observe(tr, {"k": "phase", "r": 0, "n": "eval", "b": 120.0, "t": T0 + 1}, T0 + 1)
    # rank 1 waits in the next collective, silent; the hang timeout (10 s) is long past
    assert detect_hang(tr, T0 + 100, 10.0, "training") is None
    v = detect_hang(tr, T0 + 121.5, 10.0, "training")  # the evaluation overran its budget
    assert v is not None and v.culprit == 0 and "phase 'eval'" in v.evidence and v.onset == T0 + 1
    observe(tr, {"k": "phase", "r": 0, "n": "", "b": 0.0, "t": T0 + 50}, T0 + 50)  # it ended in time
    observe(tr, {"k": "step", "r": 0, "s": 10}, T0 + 50)
    assert detect_hang(tr, T0 + 55, 10.0, "training") is None
    v = detect_hang(tr, T0 + 61, 10.0, "training")  # back to heartbeats: rank 1 is now the silent one
    assert v is not None and v.culprit == 1
