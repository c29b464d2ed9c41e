"""The worker bootstrap: the optimizer step observer (pure, fake clock), what the script sees of
``sys.argv``/``sys.path``, and that installing twice installs nothing twice."""

from __future__ import annotations

import os
import sys

import torch

from stalwart.launch.processes import bootstrap as worker_boot
from stalwart.launch.processes.bootstrap import (
    GRAD_WATCH_STEPS,
    HOOK_SECTION,
    WAIT_SECTION,
    StepObserver,
    install,
    prepare_main,
    title_of,
)
from stalwart.protocol import PREFIX, StepDone, WorkerPlace, decode
from stalwart.protocol.pipe import Receiver


class FakeSender:
    def __init__(self) -> None:
        self.sent: list[StepDone] = []

    def send(self, msg) -> None:
        self.sent.append(msg)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_steps_run_from_the_end_of_one_to_the_end_of_the_next_and_only_the_first_optimizer_counts():
    clock, out = Clock(100.0), FakeSender()
    obs = StepObserver(rank=3, sender=out, clock=clock)  # type: ignore[arg-type]
    gen, disc = object(), object()
    for t_pre, t_post in ((100.0, 100.1), (100.5, 100.6), (101.0, 101.1)):
        clock.t = t_pre
        obs.pre(gen, (), {})
        clock.t = t_post
        obs.post(gen, (), {})
        clock.t = t_post + 0.01  # a second optimizer (a GAN's discriminator) steps too: not a step
        obs.pre(disc, (), {})
        obs.post(disc, (), {})
    assert [m.step for m in out.sent] == [0, 1, 2] and {m.rank for m in out.sent} == {3}
    first, second = out.sent[0], out.sent[1]
    assert (first.t0, round(first.duration, 6)) == (100.0, 0.1)  # the first: its optimizer step only
    assert (second.t0, round(second.duration, 6)) == (100.1, 0.5)  # data, forward, backward included
    assert round(second.sections[HOOK_SECTION], 6) == 0.1


def test_the_wait_from_the_last_gradient_to_the_step_is_a_communication_section():
    # a data-parallel rank's step lasts as long as the slowest rank's; the wait after its own last
    # gradient (the all-reduce's tail) is what tells its own work from its peers'
    clock, out = Clock(0.0), FakeSender()
    obs = StepObserver(rank=0, sender=out, clock=clock)  # type: ignore[arg-type]
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(GRAD_WATCH_STEPS + 3):
        t = 10.0 * step
        clock.t = t + 1.0  # every gradient is accumulated at t + 1 ...
        model(torch.ones(1, 2)).sum().backward()
        clock.t = t + 1.0 + 0.1 * step  # ... and the optimizer steps after a wait of 0.1 x step
        obs.pre(opt, (), {})
        clock.t = t + 2.0
        obs.post(opt, (), {})
    assert WAIT_SECTION not in out.sent[0].sections  # the hooks came with the first step: no wait seen
    waits = [round(m.sections.get(WAIT_SECTION, 0.0), 6) for m in out.sent[1:]]
    assert waits == [round(0.1 * s, 6) for s in range(1, GRAD_WATCH_STEPS + 3)]
    # after the watched steps only the parameters whose gradient came last stay hooked
    assert 1 <= len(obs.grad_hooks) < 4 and set(obs.grad_hooks) <= obs.grad_lasts


def test_no_gradient_through_autograd_no_wait_and_no_hook_left():
    clock, out = Clock(0.0), FakeSender()
    obs = StepObserver(rank=0, sender=out, clock=clock)  # type: ignore[arg-type]
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1)
    for step in range(GRAD_WATCH_STEPS + 1):
        param.grad = torch.ones(3)  # assigned, as FSDP2 assigns its reduced shards
        clock.t = float(step)
        obs.pre(opt, (), {})
        obs.post(opt, (), {})
    assert all(WAIT_SECTION not in m.sections for m in out.sent) and obs.grad_hooks == {}


def test_the_script_sees_the_argv_and_path_of_python_script_py(tmp_path):
    argv, path0 = prepare_main(["sub/train.py", "--lr", "0.1"], module=False, cwd=str(tmp_path))
    assert argv == ["sub/train.py", "--lr", "0.1"] and path0 == str(tmp_path / "sub")
    argv, path0 = prepare_main(["pkg.train", "-x"], module=True, cwd=str(tmp_path))
    assert argv == ["pkg.train", "-x"] and path0 == str(tmp_path)


def test_the_title_names_the_script_rank_local_rank_and_attempt():
    place = WorkerPlace(rank=5, world_size=8, local_rank=1, attempt=2)
    t = title_of("/venv/bin/python3", ["train.py", "--steps", "9"], place)
    assert t.startswith("python3 train.py --steps 9 ")
    assert "rank 5" in t and "local_rank 1" in t and "attempt 2" in t


def test_install_twice_installs_nothing_twice_and_leaves_the_environment_alone(tmp_path):
    import setproctitle

    receiver = Receiver()
    w = receiver.new_channel()
    env = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        f"{PREFIX}IPC": str(w),
        f"{PREFIX}RUN_DIR": str(tmp_path / "run"),
        f"{PREFIX}NODE": "n0",
        f"{PREFIX}ATTEMPT": "0",
    }
    environ, argv, path = dict(os.environ), list(sys.argv), list(sys.path)
    title = setproctitle.getproctitle()
    try:
        first = install(env, ["train.py"])
        assert install(env, ["train.py"]) is first and len(first.handles) == 2
        # (torch's first optimizer step sets TORCHINDUCTOR_CACHE_DIR itself: compare before it)
        assert dict(os.environ) == environ and sys.argv == argv and sys.path == path
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        opt.step()
        got = [m for m in receiver.drain() if isinstance(m, StepDone)]
        assert [(m.rank, m.step) for m in got] == [(1, 0), (1, 1)]  # one record per step: one observer
        assert first.stack_file is not None and (tmp_path / "run" / "stacks" / "n0-a0-r1.txt").exists()
        assert decode(b"D 1 0 1.0 0.5 hook.optimizer=0.1") == StepDone(1, 0, 1.0, 0.5, {HOOK_SECTION: 0.1})
    finally:
        inst = worker_boot._INSTALLED
        if inst is not None:
            for h in inst.handles:
                h.remove()
            if inst.stack_file is not None:
                import faulthandler

                from stalwart.protocol import STACK_DUMP_SIGNAL

                faulthandler.unregister(STACK_DUMP_SIGNAL)
                inst.stack_file.close()
            if inst.observer.sender is not None:
                inst.observer.sender.close()
        worker_boot._INSTALLED = None
        setproctitle.setproctitle(title)
        os.close(w)
        receiver.close()


def test_a_rank_running_the_sdk_is_not_counted_twice_by_the_agent():
    from stalwart.launch.progress import ProgressTracker
    from stalwart.protocol import Hello

    hooked = StepDone(0, 0, 10.0, 0.5, {HOOK_SECTION: 0.1})
    sdk_step = StepDone(1, 7, 10.0, 0.5, {"forward": 0.2})
    tr = ProgressTracker(ranks=[0, 1], started=9.0)
    assert tr.observe(hooked, 11.0) is not None  # no Session: the hooks' record is the step
    assert tr.progress[0].sdk and not tr.progress[0].session and tr.progress[0].done_steps == 1
    tr.observe(Hello(1, 10.0), 11.0)
    assert tr.observe(StepDone(1, 0, 10.0, 0.5, {HOOK_SECTION: 0.1}), 11.0) is None  # dropped
    assert tr.observe(sdk_step, 11.0) is not None and tr.progress[1].done_steps == 1
    assert tr.session_ranks() == [1]


def test_the_progress_line_rate_is_the_jobs_steps_per_second_wall_clock():
    from stalwart.launch.progress import ProgressTracker

    tr = ProgressTracker(ranks=[0, 1], started=0.0)
    # both ranks' records: each step takes 0.1 s of compute but steps end every 0.25 s (data waits)
    for step in range(10):
        end = 1.0 + 0.25 * step
        for r in (0, 1):
            tr.observe(StepDone(r, step, end - 0.1, 0.1), end)
    assert abs(tr.rate() - 4.0) < 1e-9  # not 10/s (compute only), not 5/s (divided by the ranks)
    assert ProgressTracker(ranks=[0], started=0.0).rate() == 0.0
