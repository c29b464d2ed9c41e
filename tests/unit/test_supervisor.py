"""The supervisor driven with fakes (group, message pipe, control block, agent hooks) and a manual
clock: no process, no sleeping. Each test runs the real loop until the attempt's outcome."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from stalwart.diagnose.root_cause import ErrorRecord
from stalwart.events import (
    DecisionTaken,
    FailureDetected,
    IncidentRaised,
    StackCaptured,
    StragglerDetected,
    TimeoutsCalibrated,
    WorkersStopped,
)
from stalwart.exit_codes import EXIT_PREEMPTED
from stalwart.launch.attempt.monitors import SignalMonitor, decide, durability, membership, worker_exits
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
from stalwart.policy.timeouts import HangTimeoutPolicy
from stalwart.policy.world_size import SizeRule, WorldPlan
from stalwart.protocol import CheckpointDone, CorruptionFound, Hello, StepBegan, StepDone

T0 = 1_000_000.0


def cfg(diagnose_interval_s: float = 0.0, **kw):
    base = dict(
        monitor_interval_s=0.5,
        hang_policy=HangTimeoutPolicy(multiplier=3.0, floor_s=10.0, startup_s=60.0),
        hang=SimpleNamespace(startup_s=60.0, cpu_stall_s=20.0),
        workers=SimpleNamespace(stop_grace_s=3.0),
        checkpoint=SimpleNamespace(emergency_deadline_s=30.0),
        diagnosis=SimpleNamespace(interval_s=diagnose_interval_s),
        reform=SimpleNamespace(enabled=False),  # in place has tests of its own (test_inplace_*.py)
        min_nodes=1,
        max_nodes=2,
        size_rule=SizeRule(),
    )
    base.update(kw)
    return SimpleNamespace(**base)


class World:
    """A supervisor over two fake ranks; ``script(tick, world)`` plays the workers' side each tick."""

    def __init__(
        self,
        script,
        *,
        ranks=2,
        signal_at=None,
        waiting_from=None,
        raised=None,
        raised_since=None,
        stacks=None,
        world=None,
        straggler_gate=None,
        prior=(),
        **cfg_kw,
    ):
        self.clock = ManualClock(T0)
        self.group = FakeGroup.of(range(ranks))
        self.receiver = FakePipe()
        self.block = FakeBlock()
        self.ledger = RecordingLedger(run_id="r1", node="n0", attempt=1)
        self.events = self.ledger.events
        self.script = script
        self.signal_at = signal_at
        self.waiting_from = waiting_from
        self.chaos = ScriptedChaos(lambda tick: self.script(tick, self))
        self.job = FakeJobLink(
            signal_of=lambda: (
                signal.SIGTERM if self.signal_at is not None and self.tick > self.signal_at else None
            ),
            waiting_of=lambda: 1 if self.waiting_from is not None and self.tick > self.waiting_from else 0,
        )
        files = FakeFailureFiles(
            errors={1: ErrorRecord("ValueError", "bad batch", 4, T0 + 1.0)},
            raised=dict(raised or {}),
            since=dict(raised_since or {}),
            stacks=dict(stacks or {}),
        )
        self.sup = Supervisor(
            prior_step_times=prior,
            cfg=cfg(**cfg_kw),
            ledger=self.ledger,
            console=RecordingConsole(),
            files=files,
            job=self.job,
            chaos=self.chaos,
            group=self.group,
            receiver=self.receiver,
            block=self.block,
            specs=specs(range(ranks)),
            clock=self.clock,
            attempt=1,
            node="n0",
            world=world,
            straggler_gate=straggler_gate,
            read_proc=lambda pid: None,
        )

    @property
    def tick(self) -> int:
        return self.chaos.ticks

    @property
    def spares_released(self) -> int:
        return self.job.released

    @property
    def quarantined(self) -> list[tuple[str, str]]:
        return self.job.quarantined

    def send(self, *msgs):
        self.receiver.queue.extend(msgs)

    def step(self, rank, step, dur=0.2):
        now = self.clock.now()
        self.send(StepBegan(rank, step, now - dur), StepDone(rank, step, now - dur, dur, {"forward": dur}))

    def of(self, kind):
        return [e for e in self.events if isinstance(e, kind)]


def training(until: int):
    """Both ranks do one step per tick until tick ``until``."""

    def script(tick, w):
        if tick < until:
            for r in (0, 1):
                w.step(r, tick)

    return script


def rank_1_exits_at_tick_6(first=lambda w: ()):
    """Both ranks train; rank 1 exits with code 1 at tick 6; ``first(w)``: messages sent at tick 0."""

    def script(tick, w):
        if tick == 0:
            w.send(*first(w))
        training(100)(tick, w)
        if tick == 6:
            w.group.codes[1] = 1
            w.group.exit_times[1] = w.clock.now()

    return script


def test_a_crash_stops_the_group_at_once_and_records_failure_and_incident():
    w = World(rank_1_exits_at_tick_6())
    out = w.sup.run()
    assert out.status == "failed" and out.failure.kind == "exception" and out.failure.rank == 1
    assert out.failure.step == 4 and out.failure.progressed
    assert w.group.stops == [0.0]
    (fd,) = w.of(FailureDetected)
    assert fd.rank == 1 and fd.error_type == "ValueError" and fd.onset == T0 + 1.0
    (inc,) = w.of(IncidentRaised)
    assert inc.rank == 1 and inc.fault_class == "user_program" and inc.rule == "monitor:worker-exits"
    assert isinstance(w.events[-1], WorkersStopped)
    assert all(s <= 0.5 for s in w.clock.slept)  # only the manual clock moved


def test_a_crash_waits_the_stop_grace_for_survivors_that_leave_their_live_state():
    from stalwart.protocol import LoopStarted

    w = World(rank_1_exits_at_tick_6(lambda w: [LoopStarted(0, 0, 100, w.clock.now(), leaves_state=True)]))
    out = w.sup.run()
    assert out.status == "failed" and out.failure.rank == 1
    # rank 0 writes its state on the way out (train/left_state.py): the stop gives it the grace
    assert w.group.stops == [3.0]


def test_sigterm_asks_for_a_coordinated_stop_and_a_committed_save_is_preempted():
    def script(tick, w):
        if tick == 0:  # the ranks run the SDK's Session: it coordinates the stop
            w.send(*(Hello(r, w.clock.now()) for r in (0, 1)))
        if tick <= 4:
            for r in (0, 1):
                w.step(r, tick)
        if tick == 7:  # every rank saved, then exited 76
            w.send(*(CheckpointDone(r, 6, w.clock.now(), durable=True, kind="emergency") for r in (0, 1)))
        if tick == 8:
            w.group.codes.update({0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED})

    w = World(script, signal_at=4, waiting_from=4)  # a node waiting from the same tick waits for the save
    out = w.sup.run()
    assert (out.status, out.step) == ("preempted", 6)
    assert w.block.stop_after == [
        5
    ]  # two after step 3, the newest the agent had read (step 4 was in the pipe)
    assert w.group.stops == [] and not w.of(FailureDetected)


def test_a_silent_rank_is_a_hang_with_stacks_captured_before_the_stop():
    def script(tick, w):
        if tick < 8:
            for r in (0, 1):
                w.step(r, tick)
        elif tick < 200:
            w.step(0, tick)  # rank 1 fell silent; rank 0 keeps beating

    w = World(script, stacks={1: "File train.py, line 9", 0: "File train.py, line 20"})
    out = w.sup.run()
    assert out.status == "failed" and out.failure.kind == "hang" and out.failure.rank == 1
    assert w.of(TimeoutsCalibrated) and w.of(TimeoutsCalibrated)[0].hang_timeout_s == 10.0
    stacks = w.of(StackCaptured)
    assert {s.rank: s.reason for s in stacks} == {1: "hung rank", 0: "peer of the hung rank"}
    assert w.events.index(stacks[-1]) < w.events.index(w.of(WorkersStopped)[0])
    assert w.group.stops == [0.0]
    fd = w.of(FailureDetected)[0]
    # declared no later than the timeout after rank 1's last message
    assert fd.ts - fd.onset <= 10.0 and fd.ts - fd.onset >= 10.0 - 0.5
    assert w.of(IncidentRaised)[0].rule == "monitor:hang-heartbeat"


def test_a_restart_is_calibrated_by_the_step_times_before_it_so_an_early_hang_is_caught_in_time():
    """A restart that resumed close to a hang (from the survivors' live state, say) sees two steps, then
    every rank falls silent: with the earlier attempt's step times it is a hang after the calibrated
    timeout, not after the start-up timeout that an uncalibrated attempt allows."""

    def script(tick, w):
        if tick < 2:
            for r in (0, 1):
                w.step(r, tick)

    w = World(script, prior=(0.2,) * 20)
    out = w.sup.run()
    assert out.status == "failed" and out.failure.kind == "hang"
    assert w.of(TimeoutsCalibrated)[0].hang_timeout_s == 10.0
    fd = w.of(FailureDetected)[0]
    assert fd.ts - fd.onset <= 10.0


def test_with_live_diagnosis_a_hang_is_left_to_it_and_a_user_exception_is_not():
    # the collector joins a hang (or a communication failure) with the node's evidence into the one
    # incident naming the cause; a user exception is its own cause and keeps the agent's incident
    def hang(tick, w):
        if tick < 8:
            for r in (0, 1):
                w.step(r, tick)
        elif tick < 200:
            w.step(0, tick)

    w = World(hang, diagnose_interval_s=2.0)
    assert w.sup.run().failure.kind == "hang"
    assert w.of(FailureDetected) and not w.of(IncidentRaised)

    def raised(tick, w):
        training(100)(tick, w)
        if tick == 6:
            w.group.codes[1] = 1
            w.group.exit_times[1] = w.clock.now()

    w = World(raised, diagnose_interval_s=2.0)
    assert w.sup.run().failure.kind == "exception"
    assert [i.rule for i in w.of(IncidentRaised)] == ["monitor:worker-exits"]


def test_a_rank_that_raised_but_is_slow_to_exit_is_a_crash_not_a_hang():
    def script(tick, w):
        if tick == 0:
            w.send(Hello(0, w.clock.now()), Hello(1, w.clock.now()))

    w = World(script, raised={1: 1})
    out = w.sup.run()
    assert out.failure.kind == "exception" and out.failure.rank == 1
    assert not w.of(StackCaptured) or w.of(StackCaptured)[0].reason == "traceback of the failed rank"


def test_a_rank_that_recorded_its_exception_but_cannot_exit_is_a_crash_after_the_stop_grace():
    # the rank wrote its error record at T0 + 1 and stays alive (a persist thread blocked in a
    # collective with a lost peer): a crash once the 3 s grace passed, not the 60 s start-up timeout
    def script(tick, w):
        if tick == 0:
            w.send(Hello(0, w.clock.now()), Hello(1, w.clock.now()))

    w = World(script, raised_since={1: T0 + 1.0})
    out = w.sup.run()
    assert out.status == "failed" and out.failure.kind == "exception" and out.failure.rank == 1
    assert 3.0 <= w.clock.now() - (T0 + 1.0) <= 3.0 + 0.5 + 1e-9  # the grace, then at most one tick
    assert w.group.stops  # the stuck worker is stopped


def test_a_node_waiting_to_join_stops_the_group_within_its_grace():
    w = World(training(100), waiting_from=5)
    out = w.sup.run()
    assert out.status == "membership"
    assert w.group.stops == [3.0]
    assert w.of(WorkersStopped)[0].reason == "1 node(s) waiting to join"


def test_a_clean_finish_releases_the_spares_and_succeeds():
    def script(tick, w):
        training(5)(tick, w)
        if tick == 5:
            w.group.codes.update({0: 0, 1: 0})

    w = World(script)
    assert w.sup.run().status == "succeeded"
    assert w.spares_released == 1


def test_a_slowed_rank_is_recorded_as_a_straggler_while_training_goes_on():
    def script(tick, w):
        if tick < 40:
            for r in (0, 1, 2, 3):
                dur = 0.5 if r == 2 else 0.2
                now = w.clock.now()
                w.send(StepDone(r, tick, now - dur, dur, {"forward": dur}))
        elif tick == 40:
            w.group.codes.update({r: 0 for r in w.group.codes})

    plan = WorldPlan(("n0", "n1"), (), 4, "two nodes")
    w = World(script, ranks=4, world=plan)
    assert w.sup.run().status == "succeeded"
    (sd,) = w.of(StragglerDetected)
    assert sd.rank == 2 and sd.score > 2.0
    # the straggler-action policy's verdict is recorded, observe only (never acted on)
    (advice,) = w.of(DecisionTaken)
    assert advice.action in ("observe_keep", "observe_exclude_quarantine")
    assert "rank 2" in advice.reason and "observe only" in advice.reason
    assert not w.of(IncidentRaised)
    assert w.group.stops == []


# --- decide(): the priority order -------------------------------------------------------------------


def snap(**kw):
    base = dict(
        now=T0 + 10,
        tick=0.5,
        node="n0",
        started=T0,
        ranks=(
            RankView(0, T0 + 9, step=3, done_steps=3, sdk=True),
            RankView(1, T0 + 9, step=3, done_steps=3, sdk=True),
        ),
        codes={0: None, 1: None},
    )
    base.update(kw)
    return Snapshot(**base)


MONITORS = (worker_exits, durability, SignalMonitor(30.0), membership)


def test_an_exit_outranks_a_signal_and_a_joining_node():
    ds = decide(snap(codes={0: -9, 1: None}, signal=signal.SIGTERM, nodes_waiting=1), MONITORS)
    assert [d.kind for d in ds] == ["crash"]


def test_a_stop_request_is_seen_by_the_stop_rules_in_the_same_tick_and_holds_the_rest():
    ds = decide(snap(signal=signal.SIGTERM, nodes_waiting=1), MONITORS)
    assert [d.kind for d in ds] == ["request_stop", "hold"]


def test_without_anything_to_say_the_monitors_return_nothing():
    assert decide(snap(), MONITORS) == []
    assert [d.kind for d in decide(snap(nodes_waiting=3), MONITORS)] == ["membership"]


def test_the_agent_asks_its_monitors_in_the_documented_priority_order():
    from stalwart.launch.attempt.forwarded_stop import ForwardedStop
    from stalwart.launch.attempt.monitors import PRIORITY, HangMonitor, StragglerMonitor, default_monitors
    from stalwart.launch.finish_exit import FinishedNotExited

    names = {
        FinishedNotExited: "finished_not_exited",
        ForwardedStop: "forwarded_stop",
        StragglerMonitor: "stragglers",
        SignalMonitor: "signals",
        HangMonitor: "hangs",
    }
    got = tuple(names.get(type(m)) or m.__name__ for m in default_monitors(cfg()))
    assert got == PRIORITY


def _ddp_steps(slow_own: float, finish_at: int = 60):
    """Four ranks train; rank 2 works ``slow_own`` s per step, the others 0.1 s; everyone's step lasts
    as long as the slowest (the others wait in the all-reduce); every rank finishes at ``finish_at``."""
    from stalwart.protocol import LoopStarted

    def script(tick, w):
        now = w.clock.now()
        if tick == 0:
            w.send(*(LoopStarted(r, 0, 10_000, now) for r in range(4)))
        if tick < finish_at:
            dur = max(slow_own, 0.1) + 0.05
            for r in range(4):
                own = slow_own if r == 2 else 0.1
                w.send(
                    StepBegan(r, tick, now - dur),
                    StepDone(r, tick, now - dur, dur, {"forward": own, "backward": dur - own}),
                )
        elif tick == finish_at:
            w.group.codes.update({r: 0 for r in w.group.codes})

    return script


def _gate(mode):
    from stalwart.diagnose.precision import GateDecision

    return GateDecision("straggler", mode, f"test gate: {mode}")


def test_an_allowed_exclusion_quarantines_this_node_and_stops_its_workers_at_once():
    from stalwart.diagnose.straggler_action import StragglerActionConfig

    spare = WorldPlan(("n1", "n0"), ("n2",), 4, "two nodes and a hot spare")
    w = World(
        _ddp_steps(0.6),
        ranks=4,
        world=spare,
        straggler_gate=_gate("act"),
        straggler_policy=StragglerActionConfig(recovery_s=30.0),
    )
    out = w.sup.run()
    assert out.status == "excluded" and "exclude n0 and quarantine it" in out.detail
    assert w.group.stops == [0.0], "stopped at once: the job goes on without this node"
    ((node, reason),) = w.quarantined
    assert node == "n0" and out.detail == f"a straggler ({reason})"
    (sd,) = w.of(StragglerDetected)
    assert sd.rank == 2
    (dt,) = w.of(DecisionTaken)
    assert dt.action == "exclude_quarantine" and " GPU-" in dt.reason and "test gate: act" in dt.reason
    (inc,) = w.of(IncidentRaised)
    assert inc.action_taken and inc.action == "exclude_quarantine" and inc.ranks == (2,)
    assert "node state: quarantined" in inc.evidence
    assert "n0 excluded" in w.of(WorkersStopped)[0].reason
    assert w.clock.now() < T0 + 40, "acted at the first detection (step 29), not at the end"


def test_a_mild_straggler_is_kept_with_its_costs_and_training_finishes():
    from stalwart.diagnose.straggler_action import StragglerActionConfig

    halved = WorldPlan(("n1", "n0"), (), 4, "two nodes, no spare")
    w = World(
        _ddp_steps(0.2),
        ranks=4,
        world=halved,
        straggler_gate=_gate("act"),
        straggler_policy=StragglerActionConfig(recovery_s=30.0),
    )
    assert w.sup.run().status == "succeeded"
    (dt,) = w.of(DecisionTaken)
    assert dt.action == "keep" and "keep going" in dt.reason and " GPU-" in dt.reason
    assert w.quarantined == [] and w.group.stops == []


@pytest.mark.parametrize(
    ("active", "stores", "said"),
    [
        (("n1", "n0"), "the rendezvous store", "n0's agent serves the rendezvous store"),
        (("n0", "n1"), "", "n0's agent serves the round's store (as the group's first node)"),
    ],
    ids=["rendezvous-host", "first-node"],
)
def test_a_straggler_whose_agent_serves_a_store_the_others_need_is_not_excluded(active, stores, said):
    """The exclusion the test above carries out, on a node whose exit would take a store the other
    nodes need with it (ending the job for every node): it stays, and the ledger says why."""
    from stalwart.diagnose.straggler_action import StragglerActionConfig

    w = World(
        _ddp_steps(0.6),
        ranks=4,
        world=WorldPlan(active, ("n2",), 4, "two nodes and a hot spare"),
        straggler_gate=_gate("act"),
        straggler_policy=StragglerActionConfig(recovery_s=30.0),
    )
    w.job.stores = stores
    assert w.sup.run().status == "succeeded"
    assert w.quarantined == [] and w.group.stops == []
    (dt,) = w.of(DecisionTaken)
    assert dt.action == "keep" and said in dt.reason, dt.reason
    assert "leaving would end the job for every node" in dt.reason and "test gate: act" in dt.reason


def test_a_closed_gate_records_the_exclusion_it_would_make_and_keeps_training():
    spare = WorldPlan(("n1", "n0"), ("n2",), 4, "two nodes and a hot spare")
    from stalwart.diagnose.straggler_action import StragglerActionConfig

    w = World(
        _ddp_steps(0.6),
        ranks=4,
        world=spare,
        straggler_gate=_gate("observe"),
        straggler_policy=StragglerActionConfig(recovery_s=30.0),
    )
    assert w.sup.run().status == "succeeded"
    (dt,) = w.of(DecisionTaken)
    assert dt.action == "observe_exclude_quarantine" and "test gate: observe" in dt.reason
    assert w.quarantined == [] and w.group.stops == []


def _finding(verdict, suspects, nodes, confidence):
    """Both ranks report the same finding at tick 3 (every rank tells its agent), training goes on."""

    def script(tick, w):
        training(8)(tick, w)
        if tick == 3:
            w.send(
                *(
                    CorruptionFound(r, 3, verdict, suspects, nodes, confidence, w.clock.now(), ("m.w",))
                    for r in (0, 1)
                )
            )
        if tick == 8:
            w.group.codes.update({0: 0, 1: 0})

    return script


def test_a_finding_that_names_this_node_quarantines_it_once_and_training_goes_on():
    w = World(_finding("odd_one_out", (1,), ("n0",), 0.9))
    assert w.sup.run().status == "succeeded"
    ((node, reason),) = w.quarantined
    assert node == "n0" and "after step 3" in reason and "rank 1 on n0" in reason and "m.w" in reason
    assert w.job.faults == [("sdc", False)], "silent corruption: no health check can clear the node"
    dt, stay = w.of(DecisionTaken)
    assert dt.action == "sdc_quarantine" and dt.reason.endswith("node state: quarantined")
    assert stay.action == "sdc_stay" and "no valid world size is left" in stay.reason, stay.reason
    assert w.group.stops == [], "the workers keep going: the job's only node stays, its replicas rolled back"
    assert any("quarantining this node (n0)" in n for n in w.sup.console.notes)


def test_the_replay_of_a_pair_that_names_this_node_quarantines_it_after_the_pair_did_not():
    pair = _finding("pair", (), (), 0.5)

    def script(tick, w):
        pair(tick, w)
        if tick == 5:  # the replay of the same step names rank 1 (every rank reports it)
            w.send(
                *(
                    CorruptionFound(r, 3, "replayed", (1,), ("n0",), 0.9, w.clock.now(), ("m.w",))
                    for r in (0, 1)
                )
            )

    w = World(script)
    assert w.sup.run().status == "succeeded"
    ((node, reason),) = w.quarantined
    assert node == "n0" and "after step 3" in reason and "named by replaying the step" in reason
    assert w.sup.sdc.handled == {(3, "pair", ()), (3, "replayed", (1,))}


def test_a_finding_that_names_another_node_or_none_leaves_this_node_alone():
    for finding in (
        _finding("odd_one_out", (1,), ("n1",), 0.9),  # the other node's agent quarantines n1
        _finding("pair", (), (), 0.5),  # which replica is corrupted is not known
        _finding("split", (), (), 0.0),
        _finding("replayed", (), (), 0.0),  # a replay that could not tell
    ):
        w = World(finding)
        assert w.sup.run().status == "succeeded"
        assert w.quarantined == [] and w.of(DecisionTaken) == []


def test_a_healthy_job_never_quarantines():
    def script(tick, w):
        training(8)(tick, w)
        if tick == 8:
            w.group.codes.update({0: 0, 1: 0})

    w = World(script)
    assert w.sup.run().status == "succeeded"
    assert w.quarantined == [] and w.of(DecisionTaken) == [] and w.sup.sdc.handled == set()


def test_decision_kinds_are_enums_and_an_unknown_kind_is_refused():
    import pytest

    from stalwart.launch.decision import AttemptOutcome, Decision, DecisionKind

    d = Decision("hold", "saving")  # type: ignore[arg-type]  # monitors may still pass the string
    assert d.kind is DecisionKind.HOLD and d.ends_tick and not d.ends_attempt
    ended = Decision("finished", "done", outcome=AttemptOutcome("succeeded"))  # type: ignore[arg-type]
    assert ended.ends_attempt and ended.outcome is not None and ended.outcome.status == "succeeded"
    with pytest.raises(ValueError, match="unknown decision kind 'reboot'"):
        Decision("reboot", "?")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="an outcome exactly when it ends the attempt"):
        Decision(DecisionKind.CRASH, "no outcome")


# faulthandler dumps (innermost frame first; made-up paths): a rank waiting in an all-reduce
_IN_COLLECTIVE = """Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 1 in all_reduce
  File "/job/train.py", line 2 in <module>
"""


def _silent_from_tick_8(exit_at: int | None = None):
    """Two ranks that leave their live state on a peer's failure train, fall silent at tick 8 (a rank
    of another node hung), and, with ``exit_at``, end at that tick (their collective failed)."""
    from stalwart.protocol import LoopStarted

    def script(tick, w):
        ranks = sorted(w.group.codes)
        if tick == 0:
            w.send(*(LoopStarted(r, 0, 100, w.clock.now(), leaves_state=True) for r in ranks))
        if tick < 8:
            for r in ranks:
                w.step(r, tick)
        if exit_at is not None and tick == exit_at:
            w.group.codes.update(dict.fromkeys(ranks, 1))
            w.group.exit_times.update(dict.fromkeys(ranks, w.clock.now()))

    return script


TWO_NODES = WorldPlan(("n0", "n1"), (), 2, "")


def test_a_node_whose_ranks_all_wait_in_a_collective_holds_the_stop_for_the_hung_ranks_node():
    # the hang is declared about 10 s (20 ticks) after tick 8; the ranks' collective fails at tick 34,
    # inside the hold (2 x the 3 s stop grace): they end by themselves, leaving their state
    w = World(_silent_from_tick_8(exit_at=34), world=TWO_NODES, stacks={0: _IN_COLLECTIVE, 1: _IN_COLLECTIVE})
    out = w.sup.run()
    notes = [n for n in w.sup.console.notes if "holding the stop" in n]
    assert len(notes) == 1 and "the hung rank is on another node" in notes[0], w.sup.console.notes
    assert out.failure.kind != "hang"  # the exits, not a hang of this node's ranks
    assert not [e for e in w.of(FailureDetected) if e.failure == "hang"]
    assert w.group.stops == [3.0]  # the survivors' grace to write their state; nothing killed in the wait
    assert w.group.signals == []


def test_a_held_stop_whose_time_runs_out_stops_every_rank_at_once_and_records_the_hang():
    w = World(_silent_from_tick_8(), world=TWO_NODES, stacks={0: _IN_COLLECTIVE, 1: _IN_COLLECTIVE})
    out = w.sup.run()
    assert out.failure.kind == "hang"
    (fd,) = w.of(FailureDetected)
    stopped = w.of(WorkersStopped)[-1]
    assert "did not end within the hold" in stopped.reason, stopped.reason
    assert stopped.ts - fd.ts >= 6.0  # held two stop graces from the detection, which keeps its time
    assert w.group.stops == [0.0] and w.group.signals == []
    assert len(w.of(StackCaptured)) == 2


def test_alone_on_one_node_the_same_stacks_stop_at_once():
    w = World(_silent_from_tick_8(), stacks={0: _IN_COLLECTIVE, 1: _IN_COLLECTIVE})
    out = w.sup.run()
    assert out.failure.kind == "hang"
    assert not [n for n in w.sup.console.notes if "holding the stop" in n]
    assert w.group.stops == [0.0]
    stopped = w.of(WorkersStopped)[-1]
    assert stopped.ts - w.of(FailureDetected)[0].ts < 1.0


_ASLEEP = """Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/site-packages/stalwart/train/chaos_hook.py", line 1 in fire
  File "/job/train.py", line 2 in <module>
"""


def test_a_node_of_one_rank_holds_for_a_peer_node_or_kills_its_own_rank_first():
    # one rank a node: no local peer to compare with, but the group spans another node
    w = World(_silent_from_tick_8(exit_at=34), ranks=1, world=TWO_NODES, stacks={0: _IN_COLLECTIVE})
    w.sup.run()
    assert [n for n in w.sup.console.notes if "holding the stop" in n]
    assert not [e for e in w.of(FailureDetected) if e.failure == "hang"]
    w = World(_silent_from_tick_8(), ranks=1, world=TWO_NODES, stacks={0: _ASLEEP})
    out = w.sup.run()
    assert out.failure.kind == "hang" and (w.group.signals, w.group.stops) == ([signal.SIGKILL], [3.0])
    assert "outside any collective while the group spans other nodes" in w.of(WorkersStopped)[-1].reason
