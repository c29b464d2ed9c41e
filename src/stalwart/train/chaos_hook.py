"""Chaos in a worker: the run's fault plan for this rank, fired at step boundaries (a step hook).

The worker bootstrap drives the same hook from torch's optimizer step hooks for a script without a
Session (``launch/processes/hook_chaos.py``); a Session that takes the plan claims it first
(``protocol.step_history.claim_steps``), so no fault fires twice.

Imported only when the agent passed a fault plan (``stalwart run --chaos``), so a run without one
neither imports :mod:`stalwart.chaos` nor pays a per-step call for it.

* ``crash``/``exit``/``raise``/``hang`` fire once per run at the start of their step (a marker file
  in the run directory, so a restart does not repeat them); a ``crash`` or ``exit`` with ``at=`` fires
  that fraction of this rank's step time into the step, from a timer thread (a kill needs no help
  from the training thread);
* ``slow`` makes every step in its span ``factor`` times as long: the first section of each step
  spends (factor - 1) x this rank's own unslowed step time extra;
* ``bitflip`` flips one bit of the loop's state once per run (``bitflip.py``): a parameter or an
  optimizer state tensor at the end of its step, a gradient just before that step's optimizer step.
  The Session hands the hook its loop's ``state``.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..chaos.once import claim, claim_announcement, mark_injected
from ..chaos.plan import Fault, FaultPlan
from ..events import ChaosInjected, Event
from .clock import SYSTEM_CLOCK, Clock


class FaultActions:
    """What a fired fault does to this process (a test passes its own)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock

    def crash(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def exit(self) -> None:
        os._exit(1)

    def hang(self) -> None:
        while True:
            self._clock.sleep(3600)


class ChaosHook:
    def __init__(
        self,
        faults: tuple[Fault, ...],
        *,
        rank: int,
        chaos_dir: Path,
        emit: Callable[[Event], None],
        context: dict[str, Any],  # Any: an event's context is JSON of any shape (json.dumps)
        clock: Clock = SYSTEM_CLOCK,
        actions: FaultActions | None = None,
        # Any: threading.Timer's signature
        timer: Callable[[float, Callable[..., None], tuple[Any, ...]], Any] = threading.Timer,
    ) -> None:
        self.rank = rank
        self._at_step = tuple(f for f in faults if f.kind not in ("slow", "bitflip"))
        self._slow = tuple(f for f in faults if f.kind == "slow")
        self._flips = tuple(f for f in faults if f.kind == "bitflip")
        self.state: Mapping[str, Any] | None = None  # Any: the loop's state (a bitflip's victim)
        self._chaos_dir = chaos_dir
        self._emit = emit
        self._context = context
        self._clock = clock
        self._actions = actions or FaultActions(clock)
        self._timer = timer  # a mid-step fault's timer (a test passes its own)
        self._pending = False  # a slow fault may apply in the step's first section
        self._extra = 0.0  # seconds slept this step
        self.base_step_s = 0.0  # this rank's unslowed step time (moving average)
        self._announced: set[Fault] = set()

    @classmethod
    # Any: forwarded to ChaosHook's constructor (each keyword its own type)
    def from_plan(cls, plan_json: str, *, rank: int, **kwargs: Any) -> ChaosHook | None:
        """The hook for ``rank``'s faults in the plan, or None when it has none."""
        faults = FaultPlan.from_json(plan_json).for_rank(rank)
        return cls(faults, rank=rank, **kwargs) if faults else None

    def step_began(self, step: int) -> None:
        self._pending = bool(self._slow)
        for fault in self._at_step:
            if fault.step != step or not claim(self._chaos_dir, fault):
                continue
            delay = fault.at * self.base_step_s
            if delay > 0:  # mid-step: the training thread goes on until the timer kills the process
                timer = self._timer(delay, self._fire, (fault, step))
                timer.daemon = True
                timer.start()
            else:
                self._fire(fault, step)
        for fault in self._flips:  # only a Session's loop hands over a state (the bootstrap's hook has none)
            if self.state is None or fault.target != "grad" or fault.step != step:
                continue
            if claim(self._chaos_dir, fault):
                from .bitflip import flip_grad_at_next_step  # deferred: torch, for a bitflip only

                why = flip_grad_at_next_step(
                    self.state, fault.bit, lambda text, f=fault: self._flipped(f, step, text)
                )
                if why:
                    self._flipped(fault, step, why)

    def bind_state(self, state: Mapping[str, Any]) -> None:  # Any: the loop's state (torch objects)
        """The state a ``bitflip`` corrupts: the Session's loop hands it over at its start."""
        self.state = state

    def _flipped(self, fault: Fault, step: int, text: str) -> None:
        """A bitflip's ground truth: what it flipped, for the detector precision table."""
        self._emit(
            ChaosInjected(
                ts=self._clock.now(),
                fault=fault.kind,
                step=step,
                detail=f"{fault.describe()}: {text}",
                **self._context,
            )
        )

    def _fire(self, fault: Fault, step: int) -> None:
        if fault.kind in ("crash", "exit", "hang"):  # the agent then names the plan as the cause
            mark_injected(self._chaos_dir, fault.describe())
        self._emit(
            ChaosInjected(
                ts=self._clock.now(),
                fault=fault.kind,
                step=step,
                detail=fault.describe(),
                **self._context,
            )
        )
        self._inject(fault, step)

    def _inject(self, fault: Fault, step: int) -> None:
        match fault.kind:
            case "crash":
                self._actions.crash()
            case "exit":
                self._actions.exit()
            case "raise":
                raise RuntimeError(f"injected bug at step {step} (chaos: raise@rank={self.rank},step={step})")
            case "hang":
                self._actions.hang()
            case _:  # a fault the agent fires (kill-agent, storage faults): nothing to do in a worker
                pass

    def section_ended(self, step: int, name: str) -> float:
        if not self._pending:
            return 0.0
        self._pending = False
        spent = 0.0
        for fault in self._slow:
            if step >= fault.start and (fault.stop is None or step <= fault.stop) and self.base_step_s > 0:
                extra = (fault.factor - 1.0) * self.base_step_s
                self._announce(fault, step)
                self._clock.sleep(extra)
                spent += extra
        self._extra += spent
        return spent

    def _announce(self, fault: Fault, step: int) -> None:
        """A span fault goes into the ledger once per run, when it first slows a step: the ground
        truth the detector precision table counts it by (diagnose/precision.py)."""
        if fault in self._announced:
            return
        self._announced.add(fault)
        if claim_announcement(self._chaos_dir, fault):
            until = fault.stop if fault.stop is not None else -1
            self._emit(
                ChaosInjected(
                    ts=self._clock.now(),
                    fault=fault.kind,
                    step=step,
                    until_step=until,
                    detail=fault.describe(),
                    **self._context,
                )
            )

    def step_ended(self, step: int, seconds: float) -> None:
        for fault in self._flips:  # only a Session's loop hands over a state (the bootstrap's hook has none)
            if self.state is None or fault.target == "grad" or fault.step != step:
                continue
            if claim(self._chaos_dir, fault):
                from .bitflip import flip_state  # deferred: torch, for a bitflip only

                self._flipped(fault, step, flip_state(self.state, fault.target, fault.bit))
        unslowed = seconds - self._extra
        self.base_step_s = unslowed if self.base_step_s == 0 else 0.8 * self.base_step_s + 0.2 * unslowed
        self._extra = 0.0
