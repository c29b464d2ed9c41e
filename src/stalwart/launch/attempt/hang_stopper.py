"""What the supervisor does with a hang decision: capture the ranks' stacks, pin the hang on the rank
the evidence names (policy/hang_pin.py), record it, and stop this node's ranks as ``hang_stop`` says:
the hung rank first, every rank at once, or, when every rank here waits in a collective for a hung
rank of another node, nothing yet (a hold of two stop graces: that node's agent kills its rank, and
the collectives here then fail by themselves, the ranks leaving their live state on the way out).
A hold that runs out stops every rank at once, as a hang always was."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...events import FailureDetected, StackCaptured, WorkersStopped
from ...policy.hang_pin import HOLD_GRACES, HangCulprits, HangStop, HangStopKind, hang_stop
from ..decision import AttemptOutcome, Decision
from ..snapshot import Snapshot
from .hang_monitor import HeldHang, injected_hang, pin_hang, stop_hang

if TYPE_CHECKING:
    from .supervisor import Supervisor


class HangStopper:
    """The supervisor's hang path; ``held``: a hang whose stop waits for the hung rank's node."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.held: HeldHang | None = None

    def hang(self, d: Decision, snap: Snapshot) -> AttemptOutcome | None:
        sup = self.sup
        if (held := self.held) is not None:  # the hung rank's node has until then to end the collective
            if sup.clock.now() < held.until:
                return None
            self.held = None
            why = f"{held.reason}; it did not end within the hold"
            stop = HangStop(HangStopKind.AT_ONCE, frozenset(), why)
            return self._stop(held.decision, snap, held.stacks, held.pinned, stop)
        # faulthandler is the SDK's or the bootstrap's (zero): without either SIGUSR2 only kills
        booted = getattr(sup.cfg.workers, "instrument", False) and not getattr(sup.cfg, "no_python", False)
        stacks = sup.files.capture_stacks() if snap.sdk_ranks or booted else {}
        pinned = sup.in_place.hang_culprits(stacks)
        d = pin_hang(d, pinned)
        local = frozenset(s.global_rank for s in sup.specs)
        # a rank here that is not the hung one leaves its state when its collective fails (alone on
        # its node, a rank that waits for another node's hung rank counts)
        leaves = sup.tracker.leaves_state(*pinned.ranks)
        stop = hang_stop(pinned, local, other_nodes=sup.in_place.state.num_nodes > 1, leaves_state=leaves)
        if stop.kind is HangStopKind.HOLD:
            hold = HOLD_GRACES * sup.cfg.workers.stop_grace_s
            self.held = HeldHang(d, stacks, pinned, sup.clock.now() + hold, stop.reason)
            sup.console.note(f"hang of rank {d.rank}: {stop.reason}; holding the stop up to {hold:g}s")
            return None
        return self._stop(d, snap, stacks, pinned, stop)

    def _stop(
        self, d: Decision, snap: Snapshot, stacks: Mapping[int, str], pinned: HangCulprits, stop: HangStop
    ) -> AttemptOutcome | None:
        sup = self.sup
        assert d.outcome is not None and d.outcome.failure is not None
        failure, rank, ctx = d.outcome.failure, d.rank, sup.ledger.ctx()
        detected = FailureDetected(
            ts=d.outcome.detected_at,
            failure="hang",
            evidence=d.reason,
            onset=d.onset,
            step=failure.step,
            rank=rank,
            injected=injected_hang(sup.files, sup.group, rank, [s.global_rank for s in sup.specs]),
            **ctx,
        )
        sup.ledger.emit(detected)
        for r, text in stacks.items():
            reason = "hung rank" if r == rank else "peer of the hung rank"
            sup.ledger.emit(
                StackCaptured(ts=sup.clock.now(), rank=r, stack=text, reason=reason, **ctx), show=r == rank
            )
        if sup.in_place.consider(d, snap, sup.clock.now(), hung=pinned.ranks):
            sup._incident(d, detected)
            return None
        stop_hang(sup.group, stop, sup.cfg.workers.stop_grace_s)
        sup._incident(d, detected)
        sup.ledger.emit(
            WorkersStopped(ts=sup.clock.now(), reason=f"hang of rank {rank}: {stop.reason}", **ctx),
            show=False,
        )
        return d.outcome
