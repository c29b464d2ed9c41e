"""Chaos for an unchanged script: the run's fault plan fired from the bootstrap's optimizer step hooks.

A script without the SDK has no step loop Stalwart owns; the bootstrap's
:class:`~stalwart.launch.processes.bootstrap.StepObserver` counts the steps of the leading optimizer,
and drives the SDK's own :class:`~stalwart.train.chaos_hook.ChaosHook` at those boundaries, so a
fault fires, is marked injected and is recorded (``ChaosInjected``, in the rank's hook ledger) exactly
as the Session would do it:

* step ``N`` begins when the hooks' step ``N - 1`` ends (its optimizer step's post hook), and step 0
  at the first optimizer step's pre hook: the bootstrap's own step boundaries;
* ``crash``/``exit``/``hang``/``raise`` fire at the start of their step (a ``raise`` leaves the
  script's ``optimizer.step()`` with the injected error); ``at=`` counts that fraction of the step
  time from there; ``slow`` sleeps at the start of each slowed step, counted in that step's time.

A Session in the same process fires the plan itself (it claims the steps, ``protocol.step_history``):
these hooks then fire nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...protocol import WorkerEnv, WorkerPlace
from ...protocol.run_dir import RunDir
from ...protocol.step_history import session_owns_steps
from .hook_ledger import HookLedger

if TYPE_CHECKING:
    from ...events import Event
    from ...train.chaos_hook import ChaosHook

HOOK_CHAOS_SECTION = "hook.chaos"  # what the hook names the step's first section for a slow fault


class HookChaos:
    """This rank's faults, fired at the optimizer step hooks' step boundaries."""

    def __init__(self, hook: ChaosHook, ledger: HookLedger | None) -> None:
        self.hook = hook
        self._ledger = ledger

    @classmethod
    def for_worker(
        cls, wenv: WorkerEnv | None, place: WorkerPlace, ledger: HookLedger | None
    ) -> HookChaos | None:
        """The rank's hook chaos when the agent passed a fault plan with faults for it, else None
        (and :mod:`stalwart.chaos` is never imported)."""
        if wenv is None or not wenv.chaos:
            return None
        from ...train.chaos_hook import ChaosHook  # deferred: only a run with a fault plan loads chaos

        run = RunDir(Path(wenv.run_dir)) if wenv.run_dir else None
        box: list[HookChaos] = []
        hook = ChaosHook.from_plan(
            wenv.chaos,
            rank=place.rank,
            chaos_dir=run.chaos if run else Path(".stalwart-chaos"),
            emit=lambda ev: box[0].emit(ev),
            context={"run_id": wenv.run_id, "node": wenv.node, "attempt": place.attempt, "rank": place.rank},
        )
        if hook is None:
            return None
        box.append(cls(hook, ledger))
        return box[0]

    def began(self, step: int) -> None:
        """Step ``step`` starts: fire what is due (a slow fault sleeps here, in this step's time)."""
        if session_owns_steps():
            return
        self.hook.step_began(step)
        self.hook.section_ended(step, HOOK_CHAOS_SECTION)

    def ended(self, step: int, seconds: float) -> None:
        """Step ``step`` ended after ``seconds``: this rank's unslowed step time, for slow and ``at=``."""
        self.hook.step_ended(step, seconds)

    def emit(self, ev: Event) -> None:
        if self._ledger is not None:
            self._ledger.append(ev)
