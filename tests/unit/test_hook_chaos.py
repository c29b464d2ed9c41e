"""Chaos for an unchanged script: the bootstrap's optimizer step hooks fire the rank's faults at their
own step count, record them as the Session does, and stand down for a Session."""

from __future__ import annotations

import pytest

from stalwart.chaos.plan import Fault, FaultPlan
from stalwart.events import ChaosInjected
from stalwart.launch.processes import hook_chaos
from stalwart.launch.processes.bootstrap import StepObserver
from stalwart.launch.processes.hook_chaos import HookChaos
from stalwart.launch.processes.hook_ledger import HookLedger
from stalwart.protocol import WorkerEnv, WorkerPlace, step_history
from stalwart.protocol.run_dir import RunDir
from stalwart.train.chaos_hook import ChaosHook, FaultActions


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


class _Actions(FaultActions):
    def __init__(self) -> None:
        self.done: list[str] = []

    def crash(self) -> None:
        self.done.append("crash")

    def exit(self) -> None:
        self.done.append("exit")

    def hang(self) -> None:
        self.done.append("hang")


@pytest.fixture(autouse=True)
def _no_session():
    step_history.release_steps()
    yield
    step_history.release_steps()


def _observer(fault: Fault, tmp_path, events: list, actions: _Actions, clock: _Clock) -> StepObserver:
    hook = ChaosHook(
        (fault,),
        rank=1,
        chaos_dir=tmp_path / "chaos",
        emit=events.append,
        context={"run_id": "r", "node": "n0", "attempt": 0, "rank": 1},
        clock=clock,  # type: ignore[arg-type]
        actions=actions,
    )
    return StepObserver(rank=1, sender=None, clock=clock, chaos=HookChaos(hook, None))


def _step(obs: StepObserver, opt: object, clock: _Clock) -> None:
    obs.pre(opt, (), {})
    clock.t += 0.1
    obs.post(opt, (), {})
    clock.t += 0.4  # data, forward and backward of the next step


def test_a_crash_fires_once_the_hooks_counted_its_step_and_is_recorded_as_the_session_records_it(tmp_path):
    clock, events, actions, opt = _Clock(), [], _Actions(), object()
    obs = _observer(Fault("crash", rank=1, step=5), tmp_path, events, actions, clock)
    for _ in range(4):
        _step(obs, opt, clock)
    assert actions.done == [] and events == []
    _step(obs, opt, clock)  # step 4 ends: step 5 begins
    assert actions.done == ["crash"]
    [ev] = events
    assert isinstance(ev, ChaosInjected)
    assert (ev.fault, ev.step, ev.rank, ev.node, ev.detail) == (
        "crash",
        5,
        1,
        "n0",
        "crash at rank 1, step 5",
    )
    assert list((tmp_path / "chaos").glob("injected-*"))  # the agent labels the kill as injected
    for _ in range(3):
        _step(obs, opt, clock)
    assert actions.done == ["crash"]  # once per run


def test_a_fault_at_step_0_fires_at_the_first_optimizer_step(tmp_path):
    clock, events, actions = _Clock(), [], _Actions()
    obs = _observer(Fault("hang", rank=1, step=0), tmp_path, events, actions, clock)
    obs.pre(object(), (), {})
    assert actions.done == ["hang"] and events[0].step == 0


def test_a_raise_leaves_the_scripts_optimizer_step(tmp_path):
    clock, events, actions, opt = _Clock(), [], _Actions(), object()
    obs = _observer(Fault("raise", rank=1, step=2), tmp_path, events, actions, clock)
    _step(obs, opt, clock)
    with pytest.raises(RuntimeError, match="injected bug at step 2"):
        _step(obs, opt, clock)
    assert [e.fault for e in events] == ["raise"]


def test_slow_sleeps_in_each_slowed_step_by_the_ranks_own_step_time(tmp_path):
    clock, events, actions, opt = _Clock(), [], _Actions(), object()
    obs = _observer(Fault("slow", rank=1, factor=2.0, start=3, stop=4), tmp_path, events, actions, clock)
    for _ in range(7):
        _step(obs, opt, clock)
    assert len(clock.slept) == 2  # steps 3 and 4, not before nor after
    assert [(e.fault, e.step, e.until_step) for e in events] == [("slow", 3, 4)]


def test_a_session_in_the_process_takes_the_plan_and_the_hooks_fire_nothing(tmp_path, monkeypatch):
    clock, events, actions, opt = _Clock(), [], _Actions(), object()
    obs = _observer(Fault("crash", rank=1, step=1), tmp_path, events, actions, clock)
    step_history.claim_steps()  # handed back by the fixture
    for _ in range(3):
        _step(obs, opt, clock)
    assert actions.done == [] and events == []


def _env(tmp_path, plan: str) -> WorkerEnv:
    return WorkerEnv(run_id="r", run_dir=str(tmp_path), node="n0", attempt=0, chaos=plan)


def test_a_worker_without_a_plan_or_without_faults_of_its_own_gets_no_hook_chaos(tmp_path):
    place = WorkerPlace(rank=1, local_rank=1, world_size=2)
    assert HookChaos.for_worker(None, place, None) is None
    assert HookChaos.for_worker(_env(tmp_path, ""), place, None) is None
    plan = FaultPlan((Fault("crash", rank=0, step=3),)).to_json()
    assert HookChaos.for_worker(_env(tmp_path, plan), place, None) is None


def test_the_hook_chaos_records_in_the_ranks_hook_ledger(tmp_path):
    from stalwart.ledger import read_merged

    place = WorkerPlace(rank=1, local_rank=1, world_size=2)
    plan = FaultPlan((Fault("raise", rank=1, step=0),)).to_json()
    ledger = HookLedger(RunDir(tmp_path).hook_ledger("n0", 0, 1, 99), 1)
    chaos = HookChaos.for_worker(_env(tmp_path, plan), place, ledger)
    assert chaos is not None
    with pytest.raises(RuntimeError):
        chaos.began(0)
    [ev] = [e for e in read_merged(tmp_path) if isinstance(e, ChaosInjected)]
    assert (ev.fault, ev.step, ev.rank, ev.run_id) == ("raise", 0, 1, "r")
    assert hook_chaos.HOOK_CHAOS_SECTION == "hook.chaos"
