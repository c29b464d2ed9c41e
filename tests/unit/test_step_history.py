"""Where an unchanged script really is: its resume point from the parameters it starts with (pure),
the rank's history file, the sampled fingerprint, and the bootstrap hooks numbering their steps
from the resume point (issue 38, point 1)."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from stalwart.events import TrainingResumed
from stalwart.launch.processes.bootstrap import StepObserver
from stalwart.launch.processes.step_locator import Place, StepLocator
from stalwart.protocol import step_history
from stalwart.protocol.step_history import (
    INITIAL,
    ResumeSource,
    StepHistory,
    optimizer_steps,
    parse,
    resume_point,
    script_resume,
)
from stalwart.train import fingerprint


@pytest.fixture(autouse=True)
def _no_session():
    step_history.release_steps()
    yield
    step_history.release_steps()


HISTORY = {"init": INITIAL, "a": 0, "b": 1, "c": 2}


@pytest.mark.parametrize(
    ("fp", "history", "count", "fresh", "step", "source"),
    [
        ("x", {}, None, True, 0, ResumeSource.FIRST_START),
        ("b", HISTORY, None, False, 2, ResumeSource.FINGERPRINT),
        ("init", HISTORY, None, True, 0, ResumeSource.FINGERPRINT),
        ("zz", HISTORY, 17, False, 17, ResumeSource.OPTIMIZER),
        ("zz", HISTORY, None, True, 0, ResumeSource.NEW_STATE),
        ("zz", HISTORY, None, False, 0, ResumeSource.UNKNOWN),
        ("", HISTORY, None, False, 0, ResumeSource.UNKNOWN),  # no parameters: never a match
    ],
)
def test_resume_point_says_where_and_how_it_is_known(fp, history, count, fresh, step, source):
    point = resume_point(fp, history, count, fresh)
    assert (point.step, point.source) == (step, source)
    assert point.label.startswith(f"script:{source.name.lower()}: ") and point.reason


def test_a_fingerprint_match_wins_over_the_optimizers_step_count():
    # a model resumed from step 1 whose Adam state says 2 steps (it counts from 1): the parameters say it
    assert resume_point("b", HISTORY, 2, False).step == 2


def test_parse_keeps_the_newest_step_per_fingerprint_and_skips_torn_lines():
    lines = ["-1 init", "0 a", "1 b", "garbage", "2", "x y", "5 a", "3 c"]
    assert parse(lines) == {"init": -1, "a": 5, "b": 1, "c": 3}


def test_the_history_file_is_private_appended_and_read_back(tmp_path):
    path = tmp_path / "steps" / "r0.txt"
    h = StepHistory(path)
    assert h.read() == {}
    h.record(INITIAL, "init")
    h.record(0, "a")
    h.record(1, "")  # no parameters: nothing recorded
    h.close()
    StepHistory(path).record(1, "b")
    assert StepHistory(path).read() == {"init": -1, "a": 0, "b": 1}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_the_history_never_follows_a_planted_link(tmp_path):
    (tmp_path / "steps").mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (tmp_path / "steps" / "r0.txt").symlink_to(target)
    StepHistory(tmp_path / "steps" / "r0.txt").record(0, "a")  # refused, quietly: training goes on
    assert target.read_text() == "keep\n"


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    return m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def _train(m: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    m(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()


def test_fingerprint_matches_a_saved_and_loaded_state_and_tells_steps_apart(tmp_path):
    m, opt = _model()
    picks = fingerprint.pick(list(m.parameters()))
    seen = {fingerprint.sampled(picks)}
    for _ in range(5):
        _train(m, opt)
        seen.add(fingerprint.sampled(picks))
    assert len(seen) == 6  # every step's state differs
    torch.save(m.state_dict(), tmp_path / "m.pt")
    m2, _ = _model()
    m2.load_state_dict(torch.load(tmp_path / "m.pt", weights_only=True))
    assert fingerprint.sampled(fingerprint.pick(list(m2.parameters()))) == fingerprint.sampled(picks)


def test_pick_spreads_over_the_list_with_first_and_last():
    params = [torch.zeros(3) + i for i in range(20)]
    chosen = [int(p[0]) for p in fingerprint.pick(params, tensors=4)]
    assert chosen[0] == 0 and chosen[-1] == 19 and len(chosen) == 4 and chosen == sorted(chosen)
    assert fingerprint.sampled([]) == ""


def test_optimizer_steps_reads_adams_count_and_a_new_state():
    m, _ = _model()
    adam = torch.optim.Adam(m.parameters())
    assert optimizer_steps(adam) == (None, True)
    for _ in range(3):
        _train(m, adam)
    assert optimizer_steps(adam) == (3, False)
    m2, sgd = _model()
    _train(m2, sgd)
    assert optimizer_steps(sgd) == (None, False)  # momentum buffers, no count


class _Clock:
    t = 100.0

    def __call__(self) -> float:
        self.t += 0.1
        return self.t


def _run(tmp_path, m, opt, steps: int, events: list) -> StepObserver:
    """One worker process's hooks over ``steps`` optimizer steps (rank 0: it records the resume)."""
    place = Place("r", "n0", 0, 0)
    locator = StepLocator(StepHistory(tmp_path / "r0.txt"), events.append, place, _Clock())
    sent: list = []

    class _Sender:
        def send(self, msg) -> None:
            sent.append(msg.step)

    obs = StepObserver(0, _Sender(), clock=_Clock(), locator=locator)  # type: ignore[arg-type]
    h1 = register_optimizer_step_pre_hook(obs.pre)
    h2 = register_optimizer_step_post_hook(obs.post)
    try:
        for _ in range(steps):
            _train(m, opt)
    finally:
        h1.remove()
        h2.remove()
    obs.sent = sent  # type: ignore[attr-defined]
    return obs


def test_a_restarted_script_numbers_its_steps_from_the_checkpoint_it_loaded(tmp_path):
    events: list = []
    m, opt = _model()
    first = _run(tmp_path, m, opt, 10, events)
    assert first.sent == list(range(10))  # type: ignore[attr-defined]
    saved = {"m": m.state_dict(), "o": opt.state_dict()}  # the script's own checkpoint after step 9
    torch.save(saved, tmp_path / "ckpt.pt")
    _run(tmp_path, m, opt, 5, events)  # steps 10-14, then the crash
    m2, opt2 = _model()
    snap = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    m2.load_state_dict(snap["m"])
    opt2.load_state_dict(snap["o"])
    again = _run(tmp_path, m2, opt2, 3, events)
    assert again.sent == [10, 11, 12]  # type: ignore[attr-defined]
    resumed = [e for e in events if isinstance(e, TrainingResumed)]
    assert [e.step for e in resumed] == [0, 10, 10]
    assert (
        resumed[-1].from_checkpoint
        == "script:fingerprint: resumed at step 10: the parameters are those after step 9"
    )


def test_a_script_that_starts_over_from_its_seed_is_step_zero_again(tmp_path):
    events: list = []
    _run(tmp_path, *_model(), 4, events)
    again = _run(tmp_path, *_model(), 2, events)  # the same seed, no checkpoint loaded
    assert again.sent == [0, 1]  # type: ignore[attr-defined]
    assert events[-1].from_checkpoint.startswith("script:fingerprint: from scratch")


def test_a_session_in_the_process_owns_the_steps(tmp_path, monkeypatch):
    events: list = []
    _run(tmp_path, *_model(), 3, events)
    step_history.claim_steps()  # handed back by the fixture
    m, opt = _model()
    _train(m, opt)
    again = _run(tmp_path, m, opt, 2, events)
    assert again.sent == [0, 1] and len(events) == 1  # type: ignore[attr-defined]


def test_a_resume_label_reads_back_as_its_source_and_reason_and_a_first_start_is_no_resume():
    point = resume_point("b", HISTORY, None, False)
    assert script_resume(point.label) == (ResumeSource.FINGERPRINT, point.reason)
    assert script_resume(resume_point("x", {}, None, True).label) is None  # the run's first start
    assert script_resume("live:generation 3") is None and script_resume("/ckpt/step-20") is None
    assert script_resume("script:nonsense: planted") is None
