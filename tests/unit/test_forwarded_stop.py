"""torchrun's signal semantics without the SDK's Session: the signal goes to the workers at once and
the verdict follows what they did (the pure monitor, then the supervisor over fake workers)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

from stalwart.launch.attempt.forwarded_stop import ForwardedStop
from stalwart.launch.attempt.supervisor import Supervisor
from stalwart.launch.clock import ManualClock
from stalwart.launch.fakes import (
    FakeBlock,
    FakeFailureFiles,
    FakeGroup,
    FakeJobLink,
    FakePipe,
    RecordingConsole,
    RecordingLedger,
    ScriptedChaos,
    specs,
)
from stalwart.launch.snapshot import RankView, Snapshot
from stalwart.policy.job import VERDICTS, AttemptStatus, JobSpec, Outcome, initial
from stalwart.policy.job import next as job_next
from stalwart.policy.timeouts import HangTimeoutPolicy
from stalwart.policy.world_size import SizeRule
from stalwart.protocol import Hello, StepDone

T0 = 5_000.0
FWD = ForwardedStop(deadline_s=30.0)


def snap(**kw) -> Snapshot:
    base = dict(
        now=T0 + 10.0,
        tick=0.05,
        node="n0",
        started=T0,
        ranks=(RankView(0, T0, sdk=True), RankView(1, T0, sdk=True)),  # step hooks fired, no Session
        codes={0: None, 1: None},
    )
    base.update(kw)
    return Snapshot(**base)


def test_without_a_session_the_signal_is_forwarded_at_once_and_nothing_else_runs_this_tick():
    assert FWD(snap()) is None
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        d = FWD(snap(signal=sig, now=T0 + 0.1))  # at once: no grace for an SDK to appear
        assert d.kind == "forward_signal" and d.ends_tick and not d.ends_attempt
        assert signal.Signals(sig).name in d.reason


def test_a_session_rank_leaves_the_stop_to_the_coordinated_emergency_save():
    ranks = (RankView(0, T0, sdk=True, session=True), RankView(1, T0, sdk=True))
    assert FWD(snap(signal=signal.SIGTERM, ranks=ranks)) is None


def test_workers_that_exit_zero_after_the_signal_succeeded():
    d = FWD(snap(signal=signal.SIGTERM, stop_requested_at=T0 + 5, codes={0: 0, 1: 0}))
    assert d.kind == "finished" and d.outcome.status is AttemptStatus.SUCCEEDED


def test_workers_stopped_by_the_signal_are_stopped_and_sigint_is_the_operators():
    killed = {0: -signal.SIGTERM, 1: 0}
    d = FWD(snap(signal=signal.SIGTERM, stop_requested_at=T0 + 5, codes=killed))
    assert d.kind == "stopped_exit" and d.outcome.status is AttemptStatus.STOPPED
    assert "killed by SIGTERM" in d.reason and "script's own checkpoints" in d.reason
    d = FWD(snap(signal=signal.SIGINT, stop_requested_at=T0 + 5, codes={0: 1, 1: 1}))
    assert d.outcome.status is AttemptStatus.INTERRUPTED


def test_workers_still_running_wait_until_the_deadline_then_are_stopped():
    asked = dict(signal=signal.SIGUSR1, stop_requested_at=T0 + 5, codes={0: 0, 1: None})
    assert FWD(snap(now=T0 + 34, **asked)).kind == "hold"
    d = FWD(snap(now=T0 + 36, **asked))
    assert d.kind == "pass_stop" and d.outcome.status is AttemptStatus.STOPPED


def test_the_verdicts_are_exit_0_for_finished_workers_and_76_for_stopped_ones_never_75():
    state = initial(JobSpec(node="n0"))
    done = job_next(state, Outcome(AttemptStatus.SUCCEEDED, signal=signal.SIGTERM), T0)
    assert (done.outcome, done.exit_code) == ("succeeded", 0)
    stopped = job_next(state, Outcome(AttemptStatus.STOPPED, signal=signal.SIGTERM), T0)
    assert (stopped.outcome, stopped.exit_code) == ("preempted", 76)
    assert "the script's own checkpoints decide where a requeue resumes" in stopped.reason
    assert VERDICTS["stopped"].exit_code == 76


# --- the supervisor carries it out --------------------------------------------------------------------


def _supervisor(script, signal_at: int, session: bool = False, sig: int = signal.SIGTERM):
    clock = ManualClock(T0)
    group = FakeGroup.of(range(2))
    pipe = FakePipe()
    ticks = {"n": 0}

    def play(tick):
        ticks["n"] = tick
        now = clock.now()
        if tick == 0 and session:
            pipe.queue.extend(Hello(r, now) for r in (0, 1))
        pipe.queue.extend(StepDone(r, tick, now - 0.2, 0.2) for r in (0, 1))
        script(tick, group)

    chaos = ScriptedChaos(play)
    cfg = SimpleNamespace(
        monitor_interval_s=0.5,
        hang_policy=HangTimeoutPolicy(multiplier=3.0, floor_s=10.0, startup_s=60.0),
        hang=SimpleNamespace(startup_s=60.0, cpu_stall_s=20.0),
        workers=SimpleNamespace(stop_grace_s=3.0),
        checkpoint=SimpleNamespace(emergency_deadline_s=30.0),
        diagnosis=SimpleNamespace(interval_s=0.0),
        reform=SimpleNamespace(enabled=False),
        min_nodes=1,
        max_nodes=1,
        size_rule=SizeRule(),
    )
    sup = Supervisor(
        cfg=cfg,
        ledger=RecordingLedger(run_id="r", node="n0", attempt=0),
        console=RecordingConsole(),
        files=FakeFailureFiles(),
        job=FakeJobLink(signal_of=lambda: sig if chaos.ticks > signal_at else None),
        chaos=chaos,
        group=group,
        receiver=pipe,
        block=FakeBlock(),
        specs=specs(range(2)),
        clock=clock,
        attempt=0,
        node="n0",
        read_proc=lambda pid: None,
    )
    return sup, group


def test_the_supervisor_forwards_the_signal_and_the_finished_workers_succeed():
    def script(tick, group):
        if tick == 8:  # the script's handler let the loop finish
            group.codes.update({0: 0, 1: 0})

    sup, group = _supervisor(script, signal_at=3)
    out = sup.run()
    assert group.signals == [signal.SIGTERM] and group.stops == []
    assert out.status is AttemptStatus.SUCCEEDED


def test_the_supervisor_forwards_the_signal_and_killed_workers_are_stopped():
    def script(tick, group):
        if tick == 5:
            group.codes.update({0: -signal.SIGTERM, 1: -signal.SIGTERM})

    sup, group = _supervisor(script, signal_at=3)
    out = sup.run()
    assert group.signals == [signal.SIGTERM] and out.status is AttemptStatus.STOPPED


def test_with_a_session_the_agent_coordinates_and_forwards_nothing():
    def script(tick, group):
        if tick == 8:  # every rank stopped after the coordinated step
            group.codes.update({0: 76, 1: 76})

    sup, group = _supervisor(script, signal_at=3, session=True)
    sup.run()
    assert group.signals == [] and len(sup.block.stop_after) == 1  # one coordinated stop request


def test_a_signal_before_any_worker_spoke_waits_a_bounded_start_up_grace():
    silent = (RankView(0, T0), RankView(1, T0))  # not a word yet: a Session may still be importing
    early = FWD(snap(signal=signal.SIGTERM, ranks=silent, now=T0 + 2.0))
    assert early is not None and early.kind == "hold" and "start-up" in early.reason
    late = FWD(snap(signal=signal.SIGTERM, ranks=silent, now=T0 + FWD.startup_grace_s + 0.1))
    assert late is not None and late.kind == "forward_signal"


def test_one_ctrl_c_to_the_process_group_is_the_operators_interrupt_not_a_crash():
    """A terminal's Ctrl-C reaches the agent and every worker at once: workers it killed before the
    agent acted on its own SIGINT are the interrupt, not a crash to restart from ("crash detected:
    killed by SIGINT", a restart used, then "stopped by SIGINT before start")."""

    def script(tick, group):
        if tick == 4:  # the tick the agent sees its SIGINT
            group.codes.update({0: -signal.SIGINT, 1: -signal.SIGINT})  # as Python ends a KeyboardInterrupt

    for session in (False, True):
        sup, group = _supervisor(script, signal_at=3, session=session, sig=signal.SIGINT)
        out = sup.run()
        assert out.status is AttemptStatus.INTERRUPTED, (session, out)
        assert not [e for e in sup.ledger.events if type(e).__name__ == "FailureDetected"], session


def test_workers_all_gone_during_start_up_are_not_waited_for():
    gone = (RankView(0, T0), RankView(1, T0))  # killed by the same Ctrl-C before a word
    d = FWD(
        snap(signal=signal.SIGINT, ranks=gone, codes={0: -signal.SIGINT, 1: -signal.SIGINT}, now=T0 + 2.0)
    )
    assert d is not None and d.kind == "forward_signal"  # then stopped_exit: interrupted, at once
