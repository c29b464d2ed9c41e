"""The parts behind Session: the process guard restores exactly what it installed, time comes from
the injected clock, chaos is a step hook that exists only with a fault plan, and the checkpoint
retry backs off on the clock (no real sleeping, no processes)."""

from __future__ import annotations

import signal
import sys

import pytest

from stalwart import protocol
from stalwart.chaos.plan import Fault, FaultPlan, parse_spec
from stalwart.events import ChaosInjected
from stalwart.protocol.lifetime import parent_death_signal, set_parent_death_signal
from stalwart.protocol.pipe import Receiver
from stalwart.train import Session
from stalwart.train.chaos_hook import ChaosHook
from stalwart.train.process_guard import ProcessGuard


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def mine(signum, frame):  # a handler the test process had before any session
    pass


@pytest.fixture
def own_handlers():
    before = {s: signal.signal(s, mine) for s in protocol.STOP_SIGNALS}
    yield
    for s, h in before.items():
        signal.signal(s, h)


# --- the process guard ------------------------------------------------------------------------


def test_the_guard_restores_the_handlers_and_excepthook_it_replaced(tmp_path, own_handlers):
    seen, errors = [], []
    hook = sys.excepthook
    guard = ProcessGuard(
        on_signal=seen.append,
        on_error=lambda *exc: errors.append(exc[0]),
        stack_file=tmp_path / "s" / "r0.txt",
    )
    with guard:
        assert all(signal.getsignal(s) not in (mine, signal.SIG_DFL) for s in protocol.STOP_SIGNALS)
        signal.raise_signal(signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]  # a stop request, not an exit
        assert sys.excepthook is not hook
        assert (tmp_path / "s" / "r0.txt").exists()
    assert all(signal.getsignal(s) is mine for s in protocol.STOP_SIGNALS)
    assert sys.excepthook is hook
    guard.close()  # again: nothing left to undo
    assert signal.getsignal(signal.SIGTERM) is mine


def test_the_excepthook_records_then_passes_on(tmp_path, monkeypatch):
    printed, recorded = [], []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: printed.append(exc[0]))
    guard = ProcessGuard(on_signal=lambda s: None, on_error=lambda *exc: recorded.append(exc[0])).install()
    try:
        sys.excepthook(ValueError, ValueError("x"), None)
    finally:
        guard.close()
    assert recorded == [ValueError] and printed == [ValueError]


def test_a_hook_replaced_after_the_guard_is_left_alone(own_handlers, monkeypatch):
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    recorded = []
    guard = ProcessGuard(on_signal=lambda s: None, on_error=lambda *exc: recorded.append(exc[0])).install()
    ours = sys.excepthook

    def theirs(*exc):
        ours(*exc)  # chains to the guard's hook, as a framework would

    def their_handler(signum, frame):
        pass

    sys.excepthook = theirs
    signal.signal(signal.SIGTERM, their_handler)
    guard.close()
    assert sys.excepthook is theirs and signal.getsignal(signal.SIGTERM) is their_handler
    assert signal.getsignal(signal.SIGUSR1) is mine  # still ours at close: restored
    sys.excepthook(KeyError, KeyError("k"), None)
    assert recorded == []  # the closed guard's hook only passes through


def test_the_guard_reclaims_the_stop_signals_from_a_framework(own_handlers):
    seen = []
    with ProcessGuard(on_signal=seen.append) as guard:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a framework installs its own at fit start
        guard.reclaim_signals()
        signal.raise_signal(signal.SIGTERM)
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is mine  # the handler from before the guard, not the framework's


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_parent_death_signal_is_set_under_an_agent_and_restored(own_handlers):
    import os

    before = parent_death_signal()
    assert before is not None
    try:
        with ProcessGuard(on_signal=lambda s: None, agent_pid=os.getppid()):
            assert parent_death_signal() == signal.SIGKILL
        assert parent_death_signal() == before
    finally:
        set_parent_death_signal(before)


def test_a_session_restores_the_process_on_close(tmp_path, own_handlers):
    hook = sys.excepthook
    with Session({"STALWART_W_RUN_DIR": str(tmp_path)}) as session:
        assert signal.getsignal(signal.SIGTERM) is not mine and sys.excepthook is not hook
        session.finish()
        assert signal.getsignal(signal.SIGTERM) is not mine  # finish keeps them: a later crash is recorded
    assert signal.getsignal(signal.SIGTERM) is mine and sys.excepthook is hook


# --- the clock and the link -------------------------------------------------------------------


def test_messages_carry_the_injected_clocks_time(tmp_path, own_handlers):
    clock = FakeClock(5000.0)
    rx = Receiver()
    env = {"STALWART_W_IPC": str(rx.new_channel()), "STALWART_W_RUN_DIR": str(tmp_path)}
    try:
        with Session(env, clock=clock) as session:
            assert session.under_agent and session.clock is clock
            for _ in session.loop(1, {}, resume=False):
                clock.t += 2.0
                with session.section("forward"):
                    clock.t += 0.5
            session.finish()
        msgs = rx.drain()
    finally:
        rx.close()
    assert isinstance(msgs[0], protocol.Hello) and msgs[0].t == 5000.0
    done = [m for m in msgs if isinstance(m, protocol.StepDone)]
    assert len(done) == 1 and done[0].t0 == 5000.0 and done[0].duration == 2.5
    assert done[0].sections == {"forward": 0.5}
    assert any(isinstance(m, protocol.SectionBegan) and m.t == 5002.0 for m in msgs)  # no control block
    assert isinstance(msgs[-1], protocol.Finished) and msgs[-1].t == 5002.5


class FailingCheckpoints:
    """Stands in for the checkpoints: every persist fails, every save is recorded."""

    durable_step = loaded_step = last_saved = -1

    def __init__(self) -> None:
        self.saves: list[int] = []

    def save(self, state, step, *, emergency=False):
        self.saves.append(step)
        self.last_saved = step

    def wait_durable(self, step):
        return "local: disk full"

    def close(self):
        pass


def test_make_durable_backs_off_on_the_clock(own_handlers):
    clock = FakeClock()
    with Session(env={}, clock=clock) as session:
        session._ckpt = FailingCheckpoints()
        assert session.make_durable({}, emergency=True, attempts=3) == "local: disk full"
        assert session._ckpt.saves == [0, 0, 0]
    assert clock.slept == [1.0, 2.0]


# --- chaos as a step hook ---------------------------------------------------------------------


def test_without_a_fault_plan_a_session_has_no_step_hook(own_handlers):
    with Session(env={"STALWART_W_RUN_ID": "r"}) as session:
        assert session._hooks == ()
    plan = FaultPlan((parse_spec("crash@rank=1,step=3"),)).to_json()
    with Session(env={"STALWART_W_CHAOS": plan, "RANK": "0", "WORLD_SIZE": "2"}) as session:
        assert session._hooks == ()  # a plan, but nothing for this rank
    with Session(env={"STALWART_W_CHAOS": plan, "RANK": "1", "WORLD_SIZE": "2"}) as session:
        assert [type(h) for h in session._hooks] == [ChaosHook]


def test_the_session_module_does_not_import_chaos():
    import importlib
    import subprocess

    code = (
        "import sys; from stalwart.train import Session; s = Session(env={}); s.close(); "
        "print(sorted(m for m in sys.modules if m.startswith('stalwart.chaos')))"
    )
    spec = importlib.util.find_spec("stalwart")
    root = str(__import__("pathlib").Path(spec.origin).parents[1])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={"PYTHONPATH": root}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


class Actions:
    def __init__(self) -> None:
        self.fired: list[str] = []

    def crash(self) -> None:
        self.fired.append("crash")

    def exit(self) -> None:
        self.fired.append("exit")

    def hang(self) -> None:
        self.fired.append("hang")


def hook_for(faults, tmp_path, clock=None):
    events, actions = [], Actions()
    hook = ChaosHook(
        tuple(faults),
        rank=1,
        chaos_dir=tmp_path / "chaos",
        emit=events.append,
        context={"run_id": "r", "node": "n", "attempt": 0, "rank": 1},
        clock=clock or FakeClock(),
        actions=actions,
    )
    return hook, events, actions


def test_a_fault_fires_once_per_run_at_its_step(tmp_path):
    faults = [Fault("crash", rank=1, step=2), Fault("hang", rank=1, step=4)]
    hook, events, actions = hook_for(faults, tmp_path)
    for step in range(6):
        hook.step_began(step)
    assert actions.fired == ["crash", "hang"]
    assert [(e.fault, e.step, e.rank) for e in events if isinstance(e, ChaosInjected)] == [
        ("crash", 2, 1),
        ("hang", 4, 1),
    ]
    again, _, actions = hook_for(faults, tmp_path)  # after a restart: the markers say they fired
    for step in range(6):
        again.step_began(step)
    assert actions.fired == []


class Timers:
    """Timers that start nothing: the test fires them."""

    def __init__(self) -> None:
        self.started: list[tuple[float, object, tuple]] = []

    def __call__(self, delay, fn, args):
        timers = self

        class T:
            daemon = False

            def start(self) -> None:
                timers.started.append((delay, fn, args))

        return T()


def test_a_kill_with_at_strikes_that_far_into_the_step_from_a_timer(tmp_path):
    # a fault at a step boundary loses whole steps only; real faults strike mid-step (the planner's
    # replay of a chaos run assumes that), so at= puts the kill a fraction of the step time in
    timers = Timers()
    events, actions = [], Actions()
    hook = ChaosHook(
        (Fault("crash", rank=1, step=3, at=0.25), Fault("exit", rank=1, step=0, at=0.5)),
        rank=1,
        chaos_dir=tmp_path / "chaos",
        emit=events.append,
        context={"run_id": "r", "node": "n", "attempt": 0, "rank": 1},
        clock=FakeClock(),
        actions=actions,
        timer=timers,
    )
    for step in range(4):
        hook.step_began(step)
        if step < 3:
            hook.step_ended(step, 2.0)
    # step 0: no step time known yet, so it fires at once; step 3: a quarter of the 2 s step in
    assert actions.fired == ["exit"] and len(timers.started) == 1
    delay, fire, args = timers.started[0]
    assert delay == pytest.approx(0.5) and not [e for e in events if e.fault == "crash"]
    fire(*args)  # type: ignore[operator]
    assert actions.fired == ["exit", "crash"]
    assert [(e.fault, e.step) for e in events if isinstance(e, ChaosInjected)] == [("exit", 0), ("crash", 3)]


def test_a_raise_fault_raises_in_the_training_loop(tmp_path):
    hook, _, _ = hook_for([Fault("raise", rank=1, step=1)], tmp_path)
    hook.step_began(0)
    with pytest.raises(RuntimeError, match="injected bug at step 1"):
        hook.step_began(1)


def test_a_slow_fault_stretches_the_first_section_by_the_unslowed_step_time(tmp_path):
    clock = FakeClock()
    hook, _, _ = hook_for([Fault("slow", rank=1, factor=1.5, start=1, stop=2)], tmp_path, clock)
    spent = []
    for step in range(4):
        hook.step_began(step)
        first = hook.section_ended(step, "data")
        assert hook.section_ended(step, "forward") == 0.0  # only the first section
        spent.append(first)
        hook.step_ended(step, 2.0 + first)  # the step's own work takes 2 s
    assert spent == [0.0, 1.0, 1.0, 0.0]  # (1.5 - 1) x 2 s, on steps 1-2 only
    assert clock.slept == [1.0, 1.0] and hook.base_step_s == 2.0


def test_a_guard_that_cannot_install_everything_undoes_the_rest(tmp_path, own_handlers):
    import threading

    hook, failed = sys.excepthook, []
    guard = ProcessGuard(on_signal=lambda s: None, on_error=lambda *exc: None, stack_file=tmp_path / "s.txt")

    def install():  # signal handlers can only be set from the main thread
        try:
            guard.install()
        except ValueError as exc:
            failed.append(exc)

    t = threading.Thread(target=install)
    t.start()
    t.join()
    assert failed and not guard.installed
    assert sys.excepthook is hook and signal.getsignal(signal.SIGTERM) is mine


def test_a_framework_loop_reports_through_the_step_link_on_the_sessions_clock(tmp_path, own_handlers):
    from stalwart.integrations.link import StepLink

    clock = FakeClock(100.0)
    rx = Receiver()
    env = {"STALWART_W_IPC": str(rx.new_channel()), "STALWART_W_RUN_DIR": str(tmp_path)}
    try:
        with Session(env, clock=clock) as session:
            link = StepLink(session)
            link.started(4, 10, from_checkpoint="ckpt-4")
            assert link.last_saved == 4 and link.completed == 4
            link.begin_step(4)
            link.section_begin("forward")
            clock.t += 1.0
            link.end_step(4)
            t0 = link.checkpoint_begin()
            clock.t += 0.25
            link.checkpoint_end(t0, tmp_path / "missing.ckpt", emergency=True)
            assert link.last_saved == 5
            link.finish(preempted=True)
        msgs = rx.drain()
    finally:
        rx.close()
    (done,) = [m for m in msgs if isinstance(m, protocol.StepDone)]
    assert (done.step, done.t0, done.duration, done.sections) == (4, 100.0, 1.0, {"forward": 1.0})
    ckpt = [m for m in msgs if isinstance(m, protocol.CheckpointDone)]
    assert [(c.step, c.t, c.durable, c.kind) for c in ckpt] == [
        (5, 101.25, True, protocol.DurableKind.EMERGENCY)
    ]
    assert any(isinstance(m, protocol.SectionBegan) and m.name == protocol.CHECKPOINT_SECTION for m in msgs)
