"""Every monitor of the agent, driven by hand-built snapshots (no process, no clock, no sleep)."""

from __future__ import annotations

import signal

from stalwart.diagnose.incident import Component, FaultClass
from stalwart.diagnose.root_cause import ErrorRecord
from stalwart.events import StepCompleted
from stalwart.exit_codes import EXIT_PREEMPTED
from stalwart.launch.attempt.monitors import (
    HangMonitor,
    HangPhase,
    SignalMonitor,
    StragglerMonitor,
    durability,
    membership,
    worker_exits,
)
from stalwart.launch.snapshot import CpuMark, RankView, Snapshot
from stalwart.policy.timeouts import HangTimeoutPolicy
from stalwart.protocol import CheckpointDone

T0 = 1000.0


def rank(r: int, last: float = T0 + 9.0, **kw) -> RankView:
    return RankView(r, last, **{"step": 3, "done_steps": 3, "sdk": True, **kw})


def snap(**kw) -> Snapshot:
    base = dict(
        now=T0 + 10.0,
        tick=0.05,
        node="n0",
        started=T0,
        ranks=(rank(0), rank(1)),
        codes={0: None, 1: None},
        attempt=2,
    )
    base.update(kw)
    return Snapshot(**base)


def err(step=3, ts=T0 + 5.0, type_="RuntimeError", message="boom") -> ErrorRecord:
    return ErrorRecord(type_, message, step, ts, traceback="Traceback ...", place="train.py:9")


# --- worker exits ----------------------------------------------------------------------------------


def test_no_crash_while_every_rank_runs_or_a_stop_was_asked():
    assert worker_exits(snap()) is None
    assert worker_exits(snap(codes={0: 1, 1: None}, stop_requested_at=T0 + 8)) is None


def test_ranks_killed_by_the_agents_own_stop_signal_are_the_signals_not_a_crash():
    # one Ctrl-C reaches the agent and every worker: those it killed are the signal monitors' to answer
    assert worker_exits(snap(codes={0: -signal.SIGINT, 1: None}, signal=signal.SIGINT)) is None
    assert worker_exits(snap(codes={0: -signal.SIGTERM, 1: -signal.SIGTERM}, signal=signal.SIGTERM)) is None
    crashed = worker_exits(snap(codes={0: -signal.SIGINT, 1: 1}, signal=signal.SIGINT))  # and a real failure
    assert crashed is not None and crashed.kind == "crash"


def test_user_exception_is_the_root_cause_over_an_earlier_signal_death():
    s = snap(
        codes={0: -9, 1: 1},
        exit_times={0: T0 + 6.0, 1: T0 + 7.0},
        errors={0: None, 1: err()},
    )
    d = worker_exits(s)
    assert d is not None and d.kind == "crash" and d.ends_attempt
    assert d.rank == 1 and d.exit_code == 1
    f = d.outcome.failure
    assert (f.kind, f.step, f.attempt, f.signature) == ("exception", 3, 2, "RuntimeError: boom at train.py:9")
    assert d.onset == T0 + 5.0  # the exception's own time, before its exit
    assert d.outcome.detected_at == s.now
    inc = d.incident
    assert (inc.fault_class, inc.component) == (FaultClass.USER, Component.USER_CODE)
    assert inc.blast_radius.ranks == (1,) and inc.blast_radius.nodes == ("n0",)
    assert inc.to_event("run", "n0", 2).rank == 1
    assert any("rank 0" in e for e in inc.evidence)  # the other failed rank is named as evidence


def test_a_lost_peer_is_never_the_root_cause_when_a_signal_death_is_there():
    comm = err(type_="torch.distributed.DistBackendError", message="NCCL error: connection reset")
    s = snap(codes={0: 1, 1: -11}, exit_times={0: T0 + 6.0, 1: T0 + 8.0}, errors={0: comm, 1: None})
    d = worker_exits(s)
    assert d.rank == 1 and d.outcome.failure.kind == "crash"
    assert d.onset == T0 + 8.0  # a signal death: the rank's last message bounds it


def test_signal_death_onset_is_the_last_message_before_the_exit():
    s = snap(ranks=(rank(0, T0 + 4.0), rank(1)), codes={0: -9, 1: None}, exit_times={0: T0 + 9.5})
    d = worker_exits(s)
    assert d.rank == 0 and d.onset == T0 + 4.0
    assert d.outcome.failure.evidence.startswith("killed by SIGKILL")
    assert d.incident.confidence < 0.9  # a signal says what killed it, not why


# --- every worker exited: durability ---------------------------------------------------------------


def done(r, step=7, durable=True, kind="emergency", reason=""):
    return CheckpointDone(r, step, T0 + 9, durable=durable, reason=reason, kind=kind)


def test_nothing_to_say_until_every_worker_exited():
    assert durability(snap(codes={0: 0, 1: None})) is None


def test_clean_exit_succeeds_and_an_unsaved_final_state_never_does():
    assert durability(snap(codes={0: 0, 1: 0})).outcome.status == "succeeded"
    d = durability(
        snap(codes={0: 0, 1: 0}, max_done_step=9, durability={1: done(1, 10, False, "final", "disk full")})
    )
    assert d.kind == "finished"
    assert (d.outcome.status, d.outcome.step, d.outcome.detail) == ("final_unsaved", 10, "rank 1: disk full")


def test_a_finished_rank_that_never_exits_is_stopped_after_the_process_group_timeout():
    from stalwart.launch.finish_exit import FinishedNotExited

    watch = FinishedNotExited(bound_s=30.0)
    ranks = (rank(0, finished=True, finished_at=T0 + 1.0), rank(1, finished=True, finished_at=T0 + 2.0))
    lingering = dict(ranks=ranks, codes={0: 0, 1: None})
    assert watch(snap(now=T0 + 31.9, **lingering)) is None  # 29.9 s after the last finish
    d = watch(snap(now=T0 + 32.0, **lingering))
    assert d is not None and d.kind == "deadline" and d.outcome.status == "succeeded"
    assert "rank 1 did not exit within 30s" in d.reason
    unsaved = watch(
        snap(
            now=T0 + 40,
            max_done_step=9,
            durability={1: done(1, 10, False, "final", "disk full")},
            **lingering,
        )
    )
    assert unsaved is not None and unsaved.outcome.status == "final_unsaved"


def test_no_exit_bound_while_a_rank_still_trains_or_every_process_is_gone():
    from stalwart.launch.finish_exit import FinishedNotExited

    watch = FinishedNotExited(bound_s=30.0)
    training = (rank(0, finished=True, finished_at=T0), rank(1))
    assert watch(snap(now=T0 + 100, ranks=training, codes={0: 0, 1: None})) is None
    done_ = (rank(0, finished=True, finished_at=T0), rank(1, finished=True, finished_at=T0))
    assert watch(snap(now=T0 + 100, ranks=done_, codes={0: 0, 1: 0})) is None
    assert watch(snap(now=T0 + 100, ranks=done_, codes={0: 0, 1: None}, stop_requested_at=T0)) is None


def test_exit_76_only_for_an_emergency_save_every_rank_committed():
    stopped = dict(codes={0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}, stop_requested_at=T0 + 5)
    d = durability(snap(durability={0: done(0), 1: done(1)}, **stopped))
    assert (d.kind, d.outcome.status, d.outcome.step) == ("stopped_exit", "preempted", 7)
    d = durability(snap(durability={0: done(0), 1: done(1, durable=False, reason="tier down")}, **stopped))
    assert (d.outcome.status, d.outcome.detail) == ("preempted_unsaved", "rank 1: tier down")
    d = durability(snap(**stopped))  # no rank said a word about its save
    assert d.outcome.status == "preempted_unsaved"
    assert d.outcome.detail == "no rank reported a committed emergency checkpoint"


def test_worker_side_preemption_without_a_stop_request():
    d = durability(
        snap(codes={0: 0, 1: EXIT_PREEMPTED}, preempted_ranks=frozenset({1}), durability={1: done(1)})
    )
    assert d.outcome.status == "preempted" and d.outcome.step == 7
    # the same preemption with nothing committed: unsaved, never a "failed" without a failure
    d = durability(snap(codes={0: 0, 1: EXIT_PREEMPTED}, preempted_ranks=frozenset({1})))
    assert d.outcome.status == "preempted_unsaved" and d.outcome.failure is None
    assert d.outcome.detail == "no rank reported a committed emergency checkpoint"


# --- signals ---------------------------------------------------------------------------------------

SIGS = SignalMonitor(emergency_deadline_s=30.0)


def test_sigint_interrupts_and_other_signals_ask_for_a_coordinated_stop():
    assert SIGS(snap()) is None
    assert SIGS(snap(signal=signal.SIGINT)).outcome.status == "interrupted"
    d = SIGS(snap(signal=signal.SIGTERM, ranks=(rank(0, step=5), rank(1, step=6))))
    assert d.kind == "request_stop" and d.stop_step == 8 and not d.ends_tick
    before = (rank(0, step=-1, done_steps=0), rank(1, step=-1, done_steps=0))
    assert SIGS(snap(signal=signal.SIGTERM, ranks=before)).stop_step == 1  # after the first step
    # beats already show step 3 under way though no step was reported done: never a stop behind it
    ahead = (rank(0, step=3, done_steps=0), rank(1, step=2, done_steps=0))
    assert SIGS(snap(signal=signal.SIGTERM, ranks=ahead)).stop_step == 5


def test_a_requested_stop_holds_until_the_deadline_then_reports_what_committed():
    asked = dict(signal=signal.SIGTERM, stop_requested_at=T0 + 5)
    d = SIGS(snap(**asked))
    assert d.kind == "hold" and d.ends_tick and not d.ends_attempt
    late = snap(now=T0 + 36, durability={0: done(0), 1: done(1, 8)}, **asked)
    assert SIGS(late).outcome.status == "preempted" and SIGS(late).outcome.step == 8
    half = snap(now=T0 + 36, durability={0: done(0)}, **asked)
    d = SIGS(half)
    assert d.kind == "deadline" and d.outcome.status == "preempted_unsaved"
    assert "--emergency-deadline 30s" in d.outcome.detail


def test_a_script_without_the_sdk_gets_the_stop_passed_on_after_its_grace():
    no_sdk = (RankView(0, T0), RankView(1, T0))
    asked = dict(signal=signal.SIGTERM, stop_requested_at=T0 + 29, ranks=no_sdk)
    assert SIGS(snap(now=T0 + 29.5, **asked)).kind == "hold"  # may still be importing the SDK
    assert SIGS(snap(now=T0 + 31, **asked)).outcome.status == "stopped"


# --- hangs -----------------------------------------------------------------------------------------

HANGS = HangMonitor(HangTimeoutPolicy(multiplier=3.0, floor_s=10.0, startup_s=600.0), 600.0, 20.0)


def test_a_silent_rank_is_a_hang_with_an_incident_naming_it_and_its_waiting_peers():
    times = tuple([0.5] * 10)
    ranks = (rank(0, T0 + 30, step=6, section="backward"), rank(1, T0 + 19, step=5, section="forward"))
    assert HANGS(snap(now=T0 + 28.9, ranks=ranks, step_times=times)) is None
    d = HANGS(snap(now=T0 + 29.0, ranks=ranks, step_times=times))  # one tick early at most
    assert d is not None and d.kind == "hang" and d.rank == 1
    assert d.outcome.failure.step == 5 and d.onset == T0 + 19
    assert "rank 1 silent" in d.reason and "hang timeout 10.000s" in d.reason
    assert d.incident.blast_radius.ranks == (1,)
    assert "waiting ranks: 0" in d.incident.evidence


def test_before_any_step_the_start_up_timeout_applies():
    ranks = (rank(0, T0, step=-1, done_steps=0), rank(1, T0, step=-1, done_steps=0))
    assert HANGS(snap(now=T0 + 500, ranks=ranks)) is None
    assert HANGS(snap(now=T0 + 600, ranks=ranks)).rank == 0


def test_after_the_loop_the_scripts_own_wrap_up_gets_the_start_up_budget():
    # the script saves its model and tears down its process group after the last step: the step
    # times say nothing of how long that takes, so the 10 s training timeout must not call it a hang
    times = tuple([0.5] * 10)
    done = (rank(0, T0 + 5, step=9, loop_done=True), rank(1, T0 + 5, step=9, loop_done=True))
    assert HANGS(snap(now=T0 + 500, ranks=done, step_times=times)) is None
    d = HANGS(snap(now=T0 + 605, ranks=done, step_times=times))
    assert d is not None and d.kind == "hang" and "wrap-up" in d.reason
    # a rank that finished no longer counts; the one still in its loop gets the training timeout
    mixed = (rank(0, T0 + 5, step=9, loop_done=True, finished=True), rank(1, T0 + 5, step=8))
    assert HANGS(snap(now=T0 + 15, ranks=mixed, step_times=times)).rank == 1


def test_the_phase_sets_the_silence_allowed_and_a_checkpoint_gets_the_start_up_budget():
    times = tuple([0.5] * 10)
    saving = (rank(0, T0 + 5, step=9, in_checkpoint=True), rank(1, T0 + 5, step=9))
    cases = {
        HangPhase.START_UP: snap(ranks=(rank(0, T0, step=-1, done_steps=0),)),
        HangPhase.CHECKPOINT: snap(ranks=saving, step_times=times),
        HangPhase.WRAP_UP: snap(ranks=(rank(0, T0 + 5, loop_done=True),), step_times=times),
        HangPhase.TRAINING: snap(step_times=times),
    }
    for phase, s in cases.items():
        assert HANGS.phase(s) is phase
        assert HANGS.timeout(s)[1] == (10.0 if phase is HangPhase.TRAINING else 600.0), phase
    assert (
        HANGS(snap(now=T0 + 500, ranks=saving, step_times=times)) is None
    )  # 10 s training timeout long past
    assert "checkpoint" in HANGS(snap(now=T0 + 605, ranks=saving, step_times=times)).reason


def test_without_the_sdk_the_hang_comes_from_cpu_progress():
    ranks = (RankView(0, T0), RankView(1, T0))
    cpu = {0: CpuMark(T0 + 2), 1: CpuMark(T0 + 5)}
    assert HANGS(snap(now=T0 + 21, ranks=ranks, cpu=cpu)) is None  # rank 1 still busy
    d = HANGS(snap(now=T0 + 25, ranks=ranks, cpu=cpu))
    assert d.rank == 0 and d.outcome.failure.step == -1
    assert "no SDK in the script" in d.reason and d.incident.rule == "monitor:hang-cpu"


def test_next_check_lands_one_tick_before_the_timeout():
    ranks = (rank(0, T0 + 8), rank(1, T0 + 9))
    s = snap(ranks=ranks, step_times=tuple([0.5] * 10))
    assert abs(HANGS.next_check(s) - (T0 + 8 + 10.0 - 0.05)) < 1e-9


# --- membership ------------------------------------------------------------------------------------


def test_a_node_waiting_to_join_reforms_the_group():
    assert membership(snap()) is None and membership(snap(nodes_waiting=0)) is None
    d = membership(snap(nodes_waiting=2))
    assert d.outcome.status == "membership" and d.reason == "2 node(s) waiting to join"


# --- stragglers ------------------------------------------------------------------------------------


def steps(n_steps: int, slow: dict[int, float], ranks=4, base=0.1, load=lambda step: 1.0):
    out = []
    for step in range(n_steps):
        for r in range(ranks):
            own = base * load(step) * slow.get(r, 1.0)
            out.append(
                StepCompleted(
                    ts=T0 + step,
                    rank=r,
                    step=step,
                    start=T0 + step,
                    duration=own + 0.05,
                    sections={"forward": own, "backward": 0.05},
                )
            )
    return tuple(out)


STRAG = StragglerMonitor()


def test_a_slow_rank_is_flagged_once_enough_windows_agree():
    assert STRAG(snap(recent_steps=steps(40, {2: 2.5}))) is None  # not due
    d = STRAG(snap(recent_steps=steps(20, {2: 2.5}), straggler_step=19))
    assert d is None  # two windows of the three it needs
    d = STRAG(snap(recent_steps=steps(30, {2: 2.5}), straggler_step=29))
    assert d.kind == "stragglers" and [r for r, _ in d.detected] == [2] and d.detected[0][1] > 2.0
    assert not d.ends_tick


def test_a_machine_wide_slowdown_flags_nobody():
    # every rank three times slower from step 10 on (a busy machine): no rank is slower than the others
    load = lambda step: 3.0 if step >= 10 else 1.0  # noqa: E731
    assert STRAG(snap(recent_steps=steps(50, {}, load=load), straggler_step=49)) is None


def test_a_flagged_rank_that_recovered_is_cleared_and_one_still_slow_is_not_repeated():
    d = STRAG(snap(recent_steps=steps(50, {}), straggler_step=49, stragglers={2: 2.5}))
    assert d.cleared == ((2, 1.0),) and d.detected == ()
    assert STRAG(snap(recent_steps=steps(50, {2: 2.5}), straggler_step=49, stragglers={2: 2.5})) is None


def test_the_straggler_action_policy_weighs_a_new_straggler_without_acting():
    from stalwart.diagnose.straggler_action import StragglerActionConfig
    from stalwart.policy.world_size import WorldPlan

    mon = StragglerMonitor(action=StragglerActionConfig(recovery_s=60.0), min_nodes=1, max_nodes=2)
    world = WorldPlan(("n1", "n0"), ("n2",), 4, "two nodes and a hot spare")
    slow = steps(30, {2: 2.5})
    # a long run left and a spare to step in: a restart costs less than 10,000 steps 2.5x slower
    d = mon(snap(recent_steps=slow, straggler_step=29, world=world, total_steps=10_000, max_done_step=29))
    (adv,) = d.advice
    assert d.kind == "stragglers" and adv.action == "observe_exclude_quarantine" and not adv.acted
    inc = adv.incident
    assert inc.action == "exclude_quarantine" and not inc.action_taken and inc.blast_radius.ranks == (2,)
    # nearly done: keep going
    d = mon(snap(recent_steps=slow, straggler_step=29, world=world, total_steps=31, max_done_step=29))
    assert d.advice[0].action == "observe_keep" and "keep going" in d.advice[0].reason
    # no spare: the run would go on at half the size, which costs more than the straggler
    halved = WorldPlan(("n1", "n0"), (), 4, "two nodes")
    d = mon(snap(recent_steps=slow, straggler_step=29, world=halved, total_steps=10_000, max_done_step=29))
    assert d.advice[0].action == "observe_keep"
    # without a world plan, or without the policy configured, detection only
    assert mon(snap(recent_steps=slow, straggler_step=29)).advice == ()
    assert STRAG(snap(recent_steps=slow, straggler_step=29, world=world, total_steps=10_000)).advice == ()


def _acting_monitor(mode="act", **policy):
    from stalwart.diagnose.precision import GateDecision
    from stalwart.diagnose.straggler_action import StragglerActionConfig

    gate = GateDecision("straggler", mode, f"gate says {mode}")
    return StragglerMonitor(
        action=StragglerActionConfig(recovery_s=60.0, **policy), min_nodes=1, max_nodes=3, gate=gate
    )


def test_an_open_gate_turns_a_costly_straggler_into_an_exclusion_that_ends_the_attempt():
    from stalwart.policy.world_size import WorldPlan

    world = WorldPlan(("n1", "n0"), ("n2",), 4, "two nodes and a hot spare")
    s = snap(recent_steps=steps(30, {2: 2.5}), straggler_step=29, world=world, total_steps=10_000)
    d = _acting_monitor()(s)
    assert d.kind == "exclude_straggler" and d.ends_attempt and d.rank == 2
    assert d.outcome.status == "excluded" and d.outcome.detail == f"a straggler ({d.reason})"
    assert "exclude n0 and quarantine it" in d.reason and " GPU-" in d.reason and "gate says act" in d.reason
    assert d.incident.action == "exclude_quarantine" and d.incident.action_taken
    (adv,) = d.advice
    assert adv.action == "exclude_quarantine" and adv.acted and d.detected[0][0] == 2
    # the same straggler with the gate closed: recorded, not acted on, and the gate's reason given
    d = _acting_monitor("observe")(s)
    assert d.kind == "stragglers" and d.advice[0].action == "observe_exclude_quarantine"
    assert "gate says observe" in d.advice[0].reason


def test_an_open_gate_keeps_a_mild_straggler_with_the_costs_as_reason():
    from stalwart.policy.world_size import WorldPlan

    # no spare: excluding n0 halves the world, which costs more than a 1.5x straggler
    world = WorldPlan(("n1", "n0"), (), 4, "two nodes")
    d = _acting_monitor()(
        snap(recent_steps=steps(30, {2: 1.5}), straggler_step=29, world=world, total_steps=10_000)
    )
    assert d.kind == "stragglers" and not d.ends_tick
    (adv,) = d.advice
    assert adv.action == "keep" and adv.acted and "keep going" in adv.reason and " GPU-" in adv.reason


def test_no_exclusion_while_a_worker_failed_or_a_stop_is_under_way():
    from stalwart.policy.world_size import WorldPlan

    world = WorldPlan(("n1", "n0"), ("n2",), 4, "two nodes and a hot spare")
    base = dict(recent_steps=steps(30, {2: 2.5}), straggler_step=29, world=world, total_steps=10_000)
    ranks = tuple(rank(r) for r in range(4))
    failed = snap(ranks=ranks, codes={0: None, 1: 1, 2: None, 3: None}, **base)
    stopping = snap(ranks=ranks, codes={r: None for r in range(4)}, stop_requested_at=T0 + 9.0, **base)
    for s in (failed, stopping):
        d = _acting_monitor()(s)
        assert d.kind == "stragglers" and d.advice[0].action == "observe_exclude_quarantine"


def test_job_slowdown_is_the_step_time_with_the_straggler_over_the_time_without_it():
    from stalwart.launch.attempt.monitors import job_slowdown

    # data parallel: every rank's step lasts as long as the slowest's; rank 1 works 0.3 s, the others
    # 0.1 s and wait the difference in the all-reduce; the collective itself takes 0.05 s
    evs = []
    for step in range(10):
        for r, own in ((0, 0.1), (1, 0.3), (2, 0.1)):
            comm = 0.35 - own
            evs.append(
                StepCompleted(
                    ts=T0 + step,
                    rank=r,
                    step=step,
                    start=T0 + step,
                    duration=0.35,
                    sections={"forward": own, "backward": comm},
                )
            )
    slowdown, healthy = job_slowdown(evs, 1)
    assert abs(healthy - 0.15) < 1e-9 and abs(slowdown - 0.35 / 0.15) < 1e-9
    assert job_slowdown([e for e in evs if e.rank == 1], 1) == (None, 0.0)  # nobody to compare with
