"""Loss and gradient-norm anomaly checks inside a worker (docs/sdc.md, "A second signal").

The values a script reports with :meth:`stalwart.train.Session.observe` are judged by
``policy/loss_anomaly.py`` against their running range; one out of it becomes a ``TrainingAnomaly``
event in the rank's ledger and a line on the agent's console. A signal, never an action: nothing
here stops, rolls back or slows training, and a failure of the check itself is swallowed.

It never makes the step wait for the device: a number or a CPU tensor is judged at once; a CUDA
tensor is copied into a small pinned host buffer without blocking, and judged at a later call once
the CUDA event recorded after the copy has completed (or at the loop's end). The running median and
MAD are recomputed every ``REFRESH`` values, not every step (a sort of the window).

AMP: a step the gradient scaler skipped (its scale went down: it found inf/NaN gradients) is not an
anomaly, and its values are neither judged nor kept; the scaler's scale is read without a sync
(``GradScaler._get_scale_async``, what its own ``get_scale`` reads; ``get_scale()`` otherwise).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..events import Event
from ..events.integrity import TrainingAnomaly
from ..policy.loss_anomaly import (
    GRAD_NORM_SETTINGS,
    LOSS_SETTINGS,
    NO_ESTIMATE,
    AnomalySettings,
    Estimate,
    Judgement,
    Signal,
    estimate,
    judge,
    judge_skips,
)
from ..protocol import Message, Note
from .clock import Clock

REFRESH = 10  # values between two recomputations of the running median and MAD
COOLDOWN = 100  # steps between two events of one signal (the anomalous steps between are counted)
IN_FLIGHT = 4  # readings copied from the device and not judged yet, at most


@dataclass
class _Reading:
    """One step's values (loss, gradient norm, scaler scale): host floats, and the device part."""

    step: int
    host: list[float | None]  # None where a value was not given or is still on its way
    enabled: bool  # a gradient scaler is in use
    places: tuple[int, ...] = ()  # which of host the device copy fills
    buf: torch.Tensor | None = None
    done: torch.cuda.Event | None = None

    def ready(self) -> bool:
        return self.done is None or bool(self.done.query())

    def values(self) -> list[float | None]:
        if self.buf is not None:
            if self.done is not None:
                self.done.synchronize()  # done already, except at the loop's end
            for i, v in zip(self.places, self.buf.tolist(), strict=False):
                self.host[i] = float(v)
        return self.host


@dataclass
class _Track:
    cfg: AnomalySettings
    values: deque[float] = field(default_factory=deque)
    est: Estimate = NO_ESTIMATE
    fresh: int = 0  # values kept since the estimate was computed

    def keep(self, v: float) -> None:
        self.values.append(v)
        if len(self.values) > self.cfg.window:
            self.values.popleft()
        self.fresh += 1
        if self.fresh >= REFRESH or self.est.count < self.cfg.warmup:
            self.est, self.fresh = estimate(self.values), 0


class AnomalyWatch:
    """One rank's loss and gradient-norm checks (lives as long as its Session)."""

    def __init__(
        self,
        emit: Callable[[Event], None],
        context: Callable[[], dict[str, Any]],  # Any: an event's context is JSON
        now: Callable[[], float],
        note: Callable[[str], None],
        *,
        loss: AnomalySettings = LOSS_SETTINGS,
        grad_norm: AnomalySettings = GRAD_NORM_SETTINGS,
        cooldown: int = COOLDOWN,
    ) -> None:
        self._emit, self._context, self._now, self._note, self._cooldown = emit, context, now, note, cooldown
        self.off = False  # the check failed once: it stays off (training never pays for it)
        self._tracks = {Signal.LOSS: _Track(loss), Signal.GRAD_NORM: _Track(grad_norm)}
        self._skips = loss  # the limit on skipped steps in a row
        self._pending: deque[_Reading] = deque()
        self._buffers: list[torch.Tensor] = []  # pinned host buffers for device copies, reused
        self._scale: float | None = None  # the scaler's scale at the previous reading
        self._skipped = 0  # steps skipped by the scaler in a row
        self._last: dict[Signal, int] = {}  # the step of each signal's last event
        self._repeats: dict[Signal, int] = {}

    @classmethod
    def of_worker(
        cls,
        rank: int,
        emit: Callable[[Event], None],
        send: Callable[[Message], None],
        context: Callable[[], dict[str, Any]],  # Any: an event's context is JSON
        clock: Clock,
    ) -> AnomalyWatch:
        """A Session's watch: events into the rank's ledger, a note to its agent if the check fails."""
        return cls(emit, context, clock.now, lambda text: send(Note(rank, text, clock.now())))

    def observe(self, step: int, loss: object, grad_norm: object = None, scaler: object = None) -> None:
        if self.off:
            return
        try:
            self._pending.append(self._read(step, loss, grad_norm, scaler))
            self._poll(wait=len(self._pending) > IN_FLIGHT)
        except Exception as exc:  # noqa: BLE001 - a failure of the check never fails the script's step
            self._turn_off(exc)

    def flush(self) -> None:
        """Judge every reading still pending (the loop ended: waiting costs no step)."""
        try:
            while self._pending and not self.off:
                self._poll(wait=True)
        except Exception as exc:  # noqa: BLE001 - as in observe
            self._turn_off(exc)

    def _turn_off(self, exc: Exception) -> None:
        self.off = True
        self._pending.clear()
        self._note(f"loss and gradient-norm checks off ({type(exc).__name__}: {exc})")

    def _poll(self, *, wait: bool = False) -> None:
        """Judge the readings whose values arrived, in step order (``wait``: the oldest anyway)."""
        while self._pending and (wait or self._pending[0].ready()):
            r = self._pending.popleft()
            loss, grad, scale = r.values()
            if r.buf is not None:
                self._buffers.append(r.buf)
            self._step(r.step, loss, grad, scale, r.enabled)
            wait = False

    # --- reading without a sync -----------------------------------------------------------------

    def _read(self, step: int, loss: object, grad_norm: object, scaler: object) -> _Reading:
        enabled = bool(scaler is not None and getattr(scaler, "is_enabled", lambda: False)())
        scale: object = None
        if enabled:
            scale_async = getattr(scaler, "_get_scale_async", None)
            scale = scale_async() if callable(scale_async) else getattr(scaler, "get_scale")()  # noqa: B009
        r = _Reading(step, [None] * 3, enabled)
        device: list[tuple[int, torch.Tensor]] = []
        for i, v in enumerate((loss, grad_norm, scale)):
            if isinstance(v, torch.Tensor):
                t = v.detach()
                if t.is_cuda:
                    device.append((i, t.reshape(-1)[:1].to(torch.float64)))
                    continue
                v = t.reshape(-1)[0] if t.numel() else None
            if v is not None:
                r.host[i] = float(v)  # type: ignore[arg-type]  # a number (anything else turns the check off)
        if device:  # one copy into pinned memory on the values' device, and an event after it
            r.places, on = tuple(i for i, _ in device), device[0][1].device
            with torch.cuda.device(on):
                r.buf = self._buffer()
                r.buf[: len(device)].copy_(torch.cat([t.to(on) for _, t in device]), non_blocking=True)
                r.done = torch.cuda.Event()
                r.done.record()
        return r

    def _buffer(self) -> torch.Tensor:
        return self._buffers.pop() if self._buffers else torch.empty(3, dtype=torch.float64, pin_memory=True)

    # --- judging --------------------------------------------------------------------------------

    def _step(
        self, step: int, loss: float | None, grad: float | None, scale: float | None, enabled: bool
    ) -> None:
        known = self._scale is not None
        fell = self._scale is not None and scale is not None and scale < self._scale
        if scale is not None:
            self._scale = scale
        given = [(s, v) for s, v in ((Signal.LOSS, loss), (Signal.GRAD_NORM, grad)) if v is not None]
        nonfinite = any(not math.isfinite(v) for _, v in given)
        # the scaler skipped this step: its scale fell (or, at its first reading, a value is inf/NaN)
        if enabled and (fell or (not known and nonfinite)):
            self._skipped += 1
            j = judge_skips(self._skipped, step=step, cfg=self._skips)
            if j.anomalous:
                self._record(j, step)
            return
        self._skipped = 0
        for signal, value in given:
            track = self._tracks[signal]
            j = judge(value, track.est, signal=signal, step=step, cfg=track.cfg)
            if j.anomalous:
                self._record(j, step)
            if math.isfinite(value):
                track.keep(value)

    def _record(self, j: Judgement, step: int) -> None:
        last = self._last.get(j.signal)
        if last is not None and abs(step - last) < self._cooldown:
            self._repeats[j.signal] = self._repeats.get(j.signal, 0) + 1
            return
        self._last[j.signal] = step
        self._emit(
            TrainingAnomaly(
                ts=self._now(),
                step=step,
                signal=j.signal.value,
                anomaly=j.kind.value,
                value=f"{j.value:.6g}",
                median=j.est.median,
                mad=j.est.mad,
                score=round(j.score, 3),
                window=j.est.count,
                repeats=self._repeats.pop(j.signal, 0),
                reason=j.reason,
                **self._context(),
            )
        )
