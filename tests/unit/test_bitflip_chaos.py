"""The bitflip chaos fault: the Session's chaos hook flips one bit of its loop's state, once, and
records what it flipped as ground truth."""

from __future__ import annotations

import torch

from stalwart.chaos.plan import parse_spec
from stalwart.events import ChaosInjected
from stalwart.train.chaos_hook import ChaosHook
from stalwart.train.fingerprint import exact


def _hook(tmp_path, spec):
    events = []
    hook = ChaosHook((parse_spec(spec),), rank=1, chaos_dir=tmp_path, emit=events.append, context={"rank": 1})
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    state = {"model": model, "optimizer": opt}
    hook.bind_state(state)
    return hook, events, model, opt


def _step(model, opt):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()


def test_a_param_flip_doubles_or_halves_one_weight_once_after_its_step(tmp_path):
    hook, events, model, opt = _hook(tmp_path, "bitflip@rank=1,step=3")
    before = model.weight.detach().clone()
    hook.step_began(3)
    hook.step_ended(2, 0.01)
    assert torch.equal(model.weight, before) and events == []
    hook.step_ended(3, 0.01)
    changed = (model.weight != before).nonzero()
    assert len(changed) == 1
    i, j = changed[0].tolist()
    assert model.weight[i, j].abs() in (before[i, j].abs() * 2, before[i, j].abs() / 2)
    (ev,) = events
    assert isinstance(ev, ChaosInjected) and ev.fault == "bitflip" and ev.step == 3 and ev.rank == 1
    assert "model.weight bit 23" in ev.detail
    hook.step_ended(3, 0.01)  # once per run
    assert len(events) == 1


def test_a_grad_flip_strikes_just_before_the_optimizer_step(tmp_path):
    hook, events, model, opt = _hook(tmp_path, "bitflip@rank=1,step=0,target=grad")
    twin = torch.nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.Adam(twin.parameters(), lr=0.1)
    hook.step_began(0)
    _step(model, opt)
    _step(twin, twin_opt)
    moments = [o.state[m.weight]["exp_avg"] for o, m in ((opt, model), (twin_opt, twin))]
    assert not torch.equal(exact(moments[:1]), exact(moments[1:]))  # Adam's first update is scale-free
    (ev,) = events
    assert "gradient of model.weight" in ev.detail
    _step(model, opt)  # the pre-hook removed itself: no second flip
    _step(twin, twin_opt)
    assert len(events) == 1
    assert not torch.equal(exact([model.weight]), exact([twin.weight]))


def test_an_optimizer_state_flip_hits_the_moment_not_the_weight(tmp_path):
    hook, events, model, opt = _hook(tmp_path, "bitflip@rank=1,step=1,target=optim")
    _step(model, opt)
    weight = model.weight.detach().clone()
    moment = opt.state[model.weight]["exp_avg"].clone()
    hook.step_ended(1, 0.01)
    assert torch.equal(model.weight, weight)
    assert not torch.equal(opt.state[model.weight]["exp_avg"], moment)
    assert "optimizer state exp_avg of model.weight" in events[0].detail
