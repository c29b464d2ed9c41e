"""Loss and gradient-norm anomaly checks in the SDK over synthetic sequences: a noisy but healthy
falling loss never raises one, a NaN or a spike does (once per cooldown, the rest counted), a step
the AMP gradient scaler skipped never does (with a real GradScaler too), a long run of skipped steps
does, and through a Session the events land in the rank's ledger while training goes on."""

from __future__ import annotations

import math
import random

import pytest
import torch

from stalwart.events.integrity import TrainingAnomaly
from stalwart.ledger import read_merged
from stalwart.train import Session
from stalwart.train.anomaly_watch import COOLDOWN, AnomalyWatch


class Recorder:
    def __init__(self) -> None:
        self.events: list[TrainingAnomaly] = []
        self.notes: list[str] = []
        self.watch = AnomalyWatch(self.events.append, lambda: {"rank": 0}, lambda: 1000.0, self.notes.append)

    def feed(self, losses, grads=None, scaler=None) -> list[TrainingAnomaly]:
        for step, loss in enumerate(losses):
            grad = None if grads is None else grads[step]
            self.watch.observe(step, loss, grad, scaler(step) if callable(scaler) else scaler)
        self.watch.flush()
        return self.events


def healthy_loss(seed: int, steps: int = 3000) -> list[float]:
    """A falling loss with 8 % multiplicative noise and now and then a heavier bump (up to +30 %)."""
    rng = random.Random(seed)
    out = []
    for t in range(steps):
        level = 0.6 + 3.0 * math.exp(-t / 400)
        noise = rng.gauss(0, 0.08) + (rng.random() * 0.3 if rng.random() < 0.01 else 0.0)
        out.append(level * (1 + noise))
    return out


def healthy_grad(seed: int, steps: int = 3000) -> list[float]:
    rng = random.Random(seed + 1000)
    return [(0.5 + 2.0 * math.exp(-t / 300)) * math.exp(rng.gauss(0, 0.2)) for t in range(steps)]


@pytest.mark.parametrize("seed", range(8))
def test_a_noisy_but_healthy_falling_loss_and_grad_norm_raise_nothing(seed):
    r = Recorder()
    assert r.feed(healthy_loss(seed), healthy_grad(seed)) == [] and r.notes == []


def test_a_nan_loss_is_recorded_at_once_then_once_per_cooldown_with_the_steps_between_counted():
    losses = healthy_loss(0, 400) + [math.nan] * 250
    events = Recorder().feed(losses)
    assert [(e.step, e.signal, e.anomaly, e.value) for e in events] == [
        (400, "loss", "nonfinite", "nan"),
        (400 + COOLDOWN, "loss", "nonfinite", "nan"),
        (400 + 2 * COOLDOWN, "loss", "nonfinite", "nan"),
    ]
    assert events[0].repeats == 0 and events[1].repeats == COOLDOWN - 1
    assert "loss at step 400 is nan" in events[0].reason


def test_a_loss_spike_is_recorded_with_its_evidence_and_the_loss_is_judged_again_after_it():
    losses = healthy_loss(1, 1000)
    losses[800] *= 4
    (e,) = Recorder().feed(losses)
    assert (e.step, e.signal, e.anomaly) == (800, "loss", "spike")
    assert e.window == 200 and e.median > 0 and e.mad > 0 and e.score > 6
    assert float(e.value) == pytest.approx(losses[800], rel=1e-5)


def test_a_gradient_norm_spike_and_an_inf_gradient_norm_without_a_scaler_are_anomalies():
    grads = healthy_grad(2, 1000)
    grads[600] *= 20
    grads[900] = math.inf
    events = Recorder().feed(healthy_loss(2, 1000), grads)
    assert [(e.step, e.signal, e.anomaly) for e in events] == [
        (600, "grad_norm", "spike"),
        (900, "grad_norm", "nonfinite"),
    ]


class FakeScaler:
    """A gradient scaler's public face: its scale halves on a step it skipped, doubles every 50."""

    def __init__(self, skipped: set[int]) -> None:
        self.skipped, self.scale = skipped, 65536.0

    def at(self, step: int) -> FakeScaler:
        if step in self.skipped:
            self.scale /= 2
        elif step % 50 == 49:
            self.scale *= 2
        return self

    def is_enabled(self) -> bool:
        return True

    def _get_scale_async(self) -> torch.Tensor:
        return torch.tensor(self.scale)


def test_steps_the_amp_scaler_skipped_are_no_anomaly_and_their_values_are_not_kept():
    steps = 1500
    skipped = {0, 1, 2, 3, 4, 5} | set(range(100, steps, 37))  # calibration at the start, then now and then
    losses, grads = healthy_loss(3, steps), healthy_grad(3, steps)
    for s in skipped:  # what a scaler skips: overflowed gradients, and now and then an overflowed loss
        grads[s] = math.inf if s % 2 else math.nan
        losses[s] = math.inf if s % 3 == 0 else losses[s] * 50
    scaler = FakeScaler(skipped)
    r = Recorder()
    assert r.feed(losses, grads, scaler.at) == []
    track = r.watch._tracks
    assert all(math.isfinite(v) and v < 10 for v in track["loss"].values)  # skipped values never kept


def test_a_long_run_of_skipped_steps_is_one_anomaly():
    steps = 200
    skipped = set(range(120, 160))
    scaler = FakeScaler(skipped)
    grads = [math.inf if s in skipped else g for s, g in enumerate(healthy_grad(4, steps))]
    events = Recorder().feed(healthy_loss(4, steps), grads, scaler.at)
    assert [(e.step, e.signal, e.anomaly, e.value) for e in events] == [(144, "scaler", "skip_run", "25")]


def test_a_real_grad_scaler_skipping_inf_gradients_raises_nothing():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    r = Recorder()
    for step in range(300):
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        if step in (0, 90, 91, 200):
            model.weight.grad[0, 0] = math.inf  # an overflow the scaler must catch
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        scaler.step(opt)
        scaler.update()
        r.watch.observe(step, loss.detach(), norm, scaler)
    r.watch.flush()
    assert r.events == [] and r.notes == []
    assert scaler.get_scale() < 1024.0  # the scaler did skip


def test_a_value_the_check_cannot_read_turns_it_off_with_a_note_never_an_error():
    r = Recorder()
    r.watch.observe(0, "not a loss")
    r.watch.observe(1, 1.0)  # off: ignored
    assert r.watch.off and r.events == [] and len(r.notes) == 1 and "checks off (ValueError" in r.notes[0]


def test_through_a_session_the_anomaly_is_in_the_ranks_ledger_and_training_goes_on(tmp_path):
    env = {"STALWART_W_RUN_DIR": str(tmp_path / "run")}
    losses = healthy_loss(5, 120)
    losses[100] = math.inf
    with Session(env) as session:
        for step in session.loop(120, {}):
            session.observe(torch.tensor(losses[step]))
        session.finish()
    assert session.completed == 120
    (e,) = [e for e in read_merged(tmp_path / "run") if isinstance(e, TrainingAnomaly)]
    assert (e.step, e.signal, e.anomaly, e.value, e.rank) == (100, "loss", "nonfinite", "inf", 0)


class FakeDeviceEvent:
    """A CUDA event's face: done once released (or waited for)."""

    def __init__(self) -> None:
        self.released = False
        self.waited = False

    def query(self) -> bool:
        return self.released

    def synchronize(self) -> None:
        self.waited = self.released = True


def test_values_still_on_the_device_are_judged_later_in_step_order_and_the_step_never_waits(monkeypatch):
    from stalwart.train import anomaly_watch

    done: list[FakeDeviceEvent] = []

    def read(self, step, loss, grad_norm, scaler):  # what a CUDA loss gives: a copy on its way
        done.append(FakeDeviceEvent())
        buf = torch.tensor([float(loss), 0.0, 0.0], dtype=torch.float64)
        return anomaly_watch._Reading(step, [None] * 3, False, places=(0,), buf=buf, done=done[-1])

    monkeypatch.setattr(AnomalyWatch, "_read", read)
    r = Recorder()
    r.watch.observe(0, math.nan)
    r.watch.observe(1, 1.0)
    assert r.events == [] and not any(d.waited for d in done), "nothing judged, nobody waited"
    done[0].released = True
    r.watch.observe(2, 1.0)
    assert [(e.step, e.value) for e in r.events] == [(0, "nan")]  # the first, once its copy arrived
    for step in range(3, 3 + anomaly_watch.IN_FLIGHT):
        r.watch.observe(step, math.inf if step == 3 else 1.0)
    assert done[1].waited, "past the readings kept in flight, the oldest is waited for (long done by then)"
    r.watch.flush()
    # step 3's inf was judged too (within the cooldown of step 0's event: counted, not recorded)
    assert [(e.step, e.value) for e in r.events] == [(0, "nan")] and r.watch._repeats == {"loss": 1}
    assert all(d.released for d in done) and not r.watch._pending


def test_the_agents_console_is_told_that_training_goes_on():
    from stalwart.train.session_scopes import live_note

    (e,) = Recorder().feed(healthy_loss(6, 60) + [math.nan])
    note = live_note(e)
    assert (
        note.startswith("training anomaly on rank 0: loss at step 60 is nan") and "training goes on" in note
    )
