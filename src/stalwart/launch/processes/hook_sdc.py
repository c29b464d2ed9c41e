"""Silent data corruption checks for an unchanged script, from the bootstrap's optimizer step hooks.

The same cross-replica check as a Session's loop (:mod:`stalwart.train.replica_check`, docs/sdc.md):
data-parallel replicas must hold bit-identical parameters and optimizer state after every step, so
every N steps (N within ``--sdc-budget`` of the step time, or ``--sdc-every``) each rank's exact
fingerprint of its leading optimizer's parameters and state is gathered on the default process group
and compared; the odd rank is named by majority in a ``SilentCorruption`` event and an incident (rank
0's hook ledger). The first check runs after the process's first optimizer step and proves the ranks
are replicas (else the check turns itself off, with a note: pipeline stages, sharded parameters, a
job without a process group).

What it cannot do for a script Stalwart does not checkpoint: roll back. There is no checkpoint it saw
verified clean, so a mismatch stops the rank with ``SilentCorruptionError`` raised from the
script's ``optimizer.step()``; the agent restarts the group, and the script resumes from its own
checkpoint (one saved before the corruption is clean; the report names the step it was found at).
Every rank tells its agent what was found, over the bootstrap's pipe, so the agent of a node named
with confidence quarantines it (as for a Session, ``launch/attempt/sdc_quarantine.py``).
A Session in the process runs its own check: these hooks then check nothing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ...errors import SilentCorruptionError
from ...protocol import WorkerEnv, WorkerPlace
from ...protocol.json_collective import device_for
from ...protocol.step_history import session_owns_steps
from .hook_ledger import HookLedger

if TYPE_CHECKING:
    from ...events import Event
    from ...protocol import CorruptionFound
    from ...protocol.pipe import Sender
    from ...train.replica_check import ReplicaCheck


class HookSdc:
    """One rank's cross-replica check at the hooks' step boundaries."""

    def __init__(
        self, wenv: WorkerEnv, place: WorkerPlace, ledger: HookLedger | None, sender: Sender | None = None
    ) -> None:
        self._wenv, self._place, self._ledger = wenv, place, ledger
        self._sender = sender  # to this rank's agent: a finding that names its node quarantines it
        self._off = wenv.sdc_every < 0
        self._check: ReplicaCheck | None = None
        self._offset = 0  # the script's step number of this process's step 0, agreed by every rank

    def after(self, optimizer: object, base: int, count: int) -> None:
        """The leading optimizer's step ended: ``count`` steps done by this process, the first of them
        the script's step ``base``. Collective on the default group when a check is due: every rank
        decides on the steps it counted itself, so a rank whose resume point is unknown never
        calls a collective the others do not."""
        if self._off or session_owns_steps():
            return
        try:
            if self._check is None:
                self._start(optimizer, base, count)
            elif self._check.due(self._offset + count, False):
                self._check.verify(self._offset + count, False)  # no clean checkpoint to roll back to: raises
        except SilentCorruptionError:
            raise  # a corruption found: the rank stops with it
        except Exception as exc:  # noqa: BLE001 - a failure of the check itself never fails the script's step
            self._off = True
            print(
                f"stalwart: silent-data-corruption checks off ({type(exc).__name__}: {exc})",
                file=sys.stderr,
                flush=True,
            )

    def _start(self, optimizer: object, base: int, count: int) -> None:
        import torch  # deferred: heavy (torch), once the script stepped
        import torch.distributed as dist  # deferred: heavy (torch), once the script stepped

        from ...train.clock import SYSTEM_CLOCK  # deferred: the SDK's parts only once a step ran
        from ...train.replica_check import ParamsOf, ReplicaCheck  # deferred: as above

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            self._off = True  # no process group: no replicas to compare
            return
        if not isinstance(optimizer, torch.optim.Optimizer):
            self._off = True
            return
        mine = torch.tensor([base], dtype=torch.int64, device=device_for(str(dist.get_backend())))
        bases = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(bases, mine)
        self._offset = base if all(int(b) == base for b in bases) else 0  # else this process's count
        w, p = self._wenv, self._place
        ctx = {"run_id": w.run_id, "node": w.node, "attempt": p.attempt, "rank": p.rank}
        self._check = ReplicaCheck(
            every=w.sdc_every,
            budget=w.sdc_budget,
            rank=p.rank,
            node=w.node,
            clock=SYSTEM_CLOCK,
            emit=self._emit,
            note=lambda text: print(f"stalwart: {text}", file=sys.stderr, flush=True),
            context=lambda: dict(ctx),
            tell=self._tell,
        )
        state = {"params": ParamsOf(optimizer), "optimizer": optimizer}
        self._check.begin(state, self._offset + count, resumed=False)
        self._off = not self._check.active

    def _tell(self, msg: CorruptionFound) -> None:
        if self._sender is not None:
            self._sender.send(msg)

    def _emit(self, ev: Event) -> None:
        if self._ledger is not None:
            self._ledger.append(ev)
