"""Every wait on the rendezvous store bounded, and no monitor behind a network call: a store whose calls
block (a host gone without a reset) leaves the supervisor's tick and the hot spare's poll answering at
once, and ends the job with exit 75 once it has been silent over the store timeout.

Fakes only: the blocking store is a call that waits on an event the test holds; time is a manual
clock; thread hand-offs are waited on with bounded event waits, never with sleeps."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from stalwart.events import WorkersStopped
from stalwart.exit_codes import EXIT_INFRA
from stalwart.job_key import JobKey, KeySource
from stalwart.launch.attempt.monitors import default_monitors, store_lost
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
from stalwart.launch.rendezvous.node_rendezvous import NodeRendezvous
from stalwart.launch.rendezvous.store_watch import StoreUnreachable, StoreWatch, within
from stalwart.launch.snapshot import Snapshot
from stalwart.policy import job
from stalwart.policy.job import AttemptStatus, End, Outcome
from stalwart.policy.timeouts import HangTimeoutPolicy
from stalwart.policy.world_size import SizeRule

T0 = 1_000_000.0
HAND_OFF_S = 10.0  # the longest a test waits for a thread to reach a point (never reached when it works)


class BlockingStore:
    """A store call that waits until the test releases it (a connection to a vanished host)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.entered.set()
        if not self.release.wait(HAND_OFF_S * 3):
            raise TimeoutError("the test never released the store")
        return 0


def _answers() -> None:
    return None


# --- the watch -----------------------------------------------------------------------------------------


def test_a_blocked_probe_leaves_the_view_answering_and_the_silence_growing():
    clock = ManualClock(T0)
    store = BlockingStore()
    watch = StoreWatch(store, clock, every_s=0.01, probe_deadline_s=0.05).start()
    try:
        assert store.entered.wait(HAND_OFF_S)
        clock.advance(30.0)
        v = watch.view()  # returns at once although the probe is stuck
        assert v.silent_s == 30.0 and v.waiting == 0 and not v.done
        assert watch.check(60.0, "the store").silent_s == 30.0
        clock.advance(31.0)
        with pytest.raises(StoreUnreachable, match=r"the store has not answered for 61s \(store timeout 60s"):
            watch.check(60.0, "the store")
    finally:
        store.release.set()
        watch.stop()


def test_an_answer_ends_the_silence():
    clock = ManualClock(T0)
    heard = threading.Event()

    def probe() -> None:
        heard.set()

    watch = StoreWatch(probe, clock, every_s=0.01)
    clock.advance(100.0)
    assert watch.view().silent_s == 100.0
    watch.start()
    try:
        assert heard.wait(HAND_OFF_S)
        with watch.lock:  # the probe's thread records the answer right after it returns
            pass
        polls = 0
        while watch.view().silent_s > 0 and polls < HAND_OFF_S / 0.01:  # bounded hand-off
            threading.Event().wait(0.01)
            polls += 1
        assert watch.view().silent_s == 0.0
    finally:
        watch.stop()


def test_the_membership_asker_runs_only_between_rounds_and_its_answers_are_read_without_waiting():
    clock = ManualClock(T0)
    asked = threading.Event()

    def ask() -> tuple[int, bool]:
        asked.set()
        return 2, True

    watch = StoreWatch(_answers, clock, every_s=0.01).start()
    try:
        watch.asking(ask)
        assert asked.wait(HAND_OFF_S)
        with watch.lock:  # an answer is in once the asker let go of the lock
            pass
        v = watch.view()
        assert (v.waiting, v.done) == (2, True)
        watch.asking(None)  # a round forms: the answers of the last one no longer hold
        assert (watch.view().waiting, watch.view().done) == (0, False)
    finally:
        watch.stop()


# --- a bounded call ----------------------------------------------------------------------------------


def _ticking(clock: ManualClock):
    """A wait that moves the manual clock by the poll instead of sleeping."""

    def wait(event: threading.Event, seconds: float) -> bool:
        if event.wait(0.001):
            return True
        clock.advance(seconds)
        return False

    return wait


def test_a_call_blocked_on_a_silent_store_is_given_up_after_the_store_timeout():
    clock = ManualClock(T0)
    store = BlockingStore()
    watch = StoreWatch(_answers, clock)  # not started: nothing answers, the silence is the clock's
    try:
        with pytest.raises(StoreUnreachable, match="forming the round has not answered"):
            within(store, watch, 60.0, "forming the round", wait=_ticking(clock))
        assert 60.0 < clock.monotonic() - T0 <= 60.0 + 0.2 + 1e-9  # the timeout, then one poll at most
    finally:
        store.release.set()


def test_a_bounded_call_returns_its_value_or_raises_its_own_error():
    clock = ManualClock(T0)
    watch = StoreWatch(_answers, clock)
    assert within(lambda: 7, watch, 60.0, "x", wait=_ticking(clock)) == 7

    def fails() -> None:
        raise ConnectionResetError("peer reset")

    with pytest.raises(ConnectionResetError, match="peer reset"):
        within(fails, watch, 60.0, "x", wait=_ticking(clock))


# --- the rendezvous of a node: torch's handler behind a store whose calls block -----------------------


class BlockingHandler:
    """torch's handler while its keep-alive thread is stuck on a dead connection: every call waits."""

    def __init__(self, store: BlockingStore) -> None:
        self.num_nodes_waiting = store
        self.next_rendezvous = store
        self.shutdown = store


def _cfg(timeout_s: float = 60.0):
    return SimpleNamespace(
        use_c10d=True,
        node_name="n1",
        rendezvous=SimpleNamespace(store_timeout_s=timeout_s, endpoint="10.0.0.1:29400", id="job"),
    )


def test_the_membership_read_never_waits_on_a_blocked_store_and_fails_after_the_store_timeout():
    clock = ManualClock(T0)
    store = BlockingStore()
    rdzv = NodeRendezvous(_cfg(), clock=clock, key=JobKey(b"k" * 32, KeySource.FILE))
    rdzv.handler = BlockingHandler(store)
    rdzv.store = SimpleNamespace(check=store)
    rdzv.watch = StoreWatch(store, clock, every_s=0.01, probe_deadline_s=0.05).start()
    rdzv.watch.asking(rdzv._ask)
    try:
        assert store.entered.wait(HAND_OFF_S)
        assert rdzv.nodes_waiting() == 0 and rdzv.job_done() is False  # at once, from the last answer
        clock.advance(60.5)
        with pytest.raises(StoreUnreachable, match=r"10\.0\.0\.1:29400 has not answered for 60s"):
            rdzv.nodes_waiting()
        with pytest.raises(StoreUnreachable):  # a hot spare's poll: the runner makes it STORE_LOST
            rdzv.job_done()
    finally:
        store.release.set()
        rdzv.watch.stop()


def test_forming_a_round_with_a_silent_store_fails_within_the_store_timeout():
    class FastClock(ManualClock):
        def monotonic(self) -> float:  # every reading is 10 s later: 7 polls pass the 60 s
            self.advance(10.0)
            return super().monotonic()

    clock = FastClock(T0)
    store = BlockingStore()
    rdzv = NodeRendezvous(_cfg(), clock=clock, key=JobKey(b"k" * 32, KeySource.FILE))
    rdzv.handler = BlockingHandler(store)
    rdzv.watch = StoreWatch(store, clock, every_s=HAND_OFF_S, probe_deadline_s=HAND_OFF_S)  # never answers
    try:
        with pytest.raises(StoreUnreachable, match="has not answered"):
            rdzv.meet()
        rdzv.close(leaving=False)  # closing is bounded too: the silence is already over the timeout
    finally:
        store.release.set()


# --- the supervisor and the job policy ---------------------------------------------------------------


def _supervisor(lost_from_tick: int):
    clock = ManualClock(T0)
    ledger = RecordingLedger(run_id="r1", node="n0", attempt=1)
    group = FakeGroup.of(range(2))
    chaos = ScriptedChaos(max_ticks=10_000)

    def waiting() -> int:
        if chaos.ticks > lost_from_tick:
            raise StoreUnreachable("the rendezvous store at 10.0.0.1:29400 has not answered for 61s")
        return 0

    cfg = SimpleNamespace(
        monitor_interval_s=0.5,
        hang_policy=HangTimeoutPolicy(startup_s=300.0),
        hang=SimpleNamespace(startup_s=300.0, cpu_stall_s=30.0),
        workers=SimpleNamespace(stop_grace_s=3.0),
        checkpoint=SimpleNamespace(emergency_deadline_s=30.0),
        diagnosis=SimpleNamespace(interval_s=0.0),
        reform=SimpleNamespace(enabled=False),
        min_nodes=1,
        max_nodes=2,
        size_rule=SizeRule(),
    )
    sup = Supervisor(
        cfg=cfg,
        ledger=ledger,
        console=RecordingConsole(),
        files=FakeFailureFiles(),
        job=FakeJobLink(waiting_of=waiting),
        chaos=chaos,
        group=group,
        receiver=FakePipe(),
        block=FakeBlock(),
        specs=specs(range(2)),
        clock=clock,
        attempt=1,
        node="n0",
        read_proc=lambda pid: None,
    )
    return sup, group, ledger, clock


def test_a_lost_store_stops_the_workers_and_the_job_ends_with_exit_75():
    sup, group, ledger, clock = _supervisor(lost_from_tick=6)
    out = sup.run()
    assert out.status is AttemptStatus.STORE_LOST and "has not answered for 61s" in out.detail
    assert group.stops == [3.0]  # within the workers' grace
    stopped = [e for e in ledger.events if isinstance(e, WorkersStopped)]
    assert stopped and stopped[0].reason.startswith("rendezvous store lost: ")
    state = job.initial(job.JobSpec(node="n0", min_nodes=1, max_nodes=2))
    d = job.next(state, Outcome(out.status, detail=out.detail), clock.now())
    assert isinstance(d, End) and d.exit_code == EXIT_INFRA
    assert d.verdict == f"rendezvous store lost during the attempt: {out.detail}"


def test_the_store_monitor_waits_while_an_emergency_save_runs_and_comes_before_membership():
    base = dict(now=T0 + 1, tick=0.5, node="n0", started=T0, ranks=(), codes={})
    assert store_lost(Snapshot(**base)) is None
    assert store_lost(Snapshot(**base, store_unreachable="silent", stop_requested_at=T0)) is None
    d = store_lost(Snapshot(**base, store_unreachable="silent", nodes_waiting=1))
    assert d is not None and d.outcome is not None and d.outcome.status is AttemptStatus.STORE_LOST
    names = [getattr(m, "__name__", type(m).__name__) for m in default_monitors(_supervisor(0)[0].cfg)]
    assert names.index("store_lost") == names.index("membership") - 1
