"""Silent data corruption, agent side: quarantine this node when a finding names it with confidence.

Every rank tells its agent what the cross-replica check found (``CorruptionFound``, sent by
``train/replica_check.py`` in a Session's loop or from an unchanged script's step hooks). The policy
(:func:`stalwart.policy.sdc.quarantine`, pure) decides whether one node is to blame: only a single
replica that differs from a strict majority names one, or the replay of a pair's (or split's)
mismatch that names one replica (verdict ``replayed``); a pair that disagrees, a split or several
odd replicas name none. The agent of that node records it quarantined in the node records through
the health lifecycle (drained in Slurm with Stalwart's owned reason when the Slurm backend is
configured; the blast-radius cap applies), as not recoverable: no health check can see silent
corruption, so a passing check never re-admits the node, an operator does; ``stalwart nodes`` shows it
with the reason.

Then the node leaves the running attempt at once when the other nodes (or a hot spare) still make a
valid world size (:func:`stalwart.policy.sdc.exit_after_quarantine`, pure): its workers are stopped
without a save (the replicas rolled back to clean state already) and the agent ends ``excluded``, as an
excluded straggler's does; the other agents see it go and re-form at the next valid size, in place
where they can; not while a stop (an emergency save) or an in-place re-formation is under way, which
its ranks take part in. Otherwise (the only node, its agent serves a store the others need, or the
lifecycle capped the quarantine) it stays, its replicas checked every interval, and the health gate
keeps it out from the job's next start.

The ledger gets a ``DecisionTaken`` (action ``sdc_quarantine``, deliberately not one of the fixing
actions that confirm a detector's firing in ``diagnose/precision.py``: a node that stays in the running
attempt proves nothing by the detector's silence afterwards), and one with action ``sdc_exclude`` when
the node leaves (the survivors' lost peer is explained by it, ``diagnose/signals.py``), or
``sdc_stay`` with the reason it stays.
"""

from __future__ import annotations

from typing_extensions import assert_never

from ...events import DecisionTaken, WorkersStopped
from ...policy.job import AttemptStatus
from ...policy.sdc import (
    NodeExit,
    ReplicaVerdict,
    SdcNodeAction,
    SdcNodeExit,
    exit_after_quarantine,
    quarantine,
)
from ...policy.world_size import SizeRule, WorldPlan
from ...protocol import CorruptionFound
from ..clock import Clock
from ..decision import AttemptOutcome
from ..ports import Console, JobLink, LedgerSink, WorkerProcesses

SDC_FAULT = "sdc"  # the fault key in the node records


class SdcQuarantine:
    """This node's response to the findings its ranks report (one per check: every rank reports it)."""

    def __init__(
        self,
        node: str,
        job: JobLink,
        ledger: LedgerSink,
        console: Console,
        clock: Clock,
        group: WorkerProcesses | None = None,
        world: WorldPlan | None = None,
        sizes: tuple[int, int, SizeRule] = (1, 1, SizeRule()),  # min_nodes, max_nodes, the size rule
    ) -> None:
        self.node, self.job, self.ledger, self.console, self.clock = node, job, ledger, console, clock
        self.group, self.world, self.sizes = group, world, sizes
        self.leaving: NodeExit | None = None  # set when the quarantined node is to leave the attempt
        # the findings this agent already judged (every rank reports each): a step's mismatch, and
        # later each replay of that step (policy.sdc.replayed), which may name a replica
        self.handled: set[tuple[int, str, tuple[int, ...]]] = set()
        self.state = ""  # the node state after the quarantine ("" while none was made)

    def seen(self, msg: CorruptionFound) -> None:
        key = (msg.step, msg.verdict, msg.suspect_ranks)
        if key in self.handled:
            return
        self.handled.add(key)
        try:
            verdict = ReplicaVerdict(msg.verdict)
        except ValueError:  # not a verdict this agent knows: nothing to act on
            return
        d = quarantine(
            verdict, msg.suspect_ranks, msg.suspect_nodes, msg.confidence, step=msg.step, tensors=msg.tensors
        )
        match d.action:
            case SdcNodeAction.KEEP:
                if self.node in msg.suspect_nodes:  # named, but not with confidence: say why it stays
                    self.console.note(f"this node ({self.node}) is not quarantined: {d.reason}")
                return
            case SdcNodeAction.QUARANTINE:
                if d.node != self.node:
                    return  # another node's agent quarantines its own node
            case _:
                assert_never(d.action)
        self._quarantine(d.reason)

    def _quarantine(self, reason: str) -> None:
        try:
            state = self.job.quarantine(self.node, reason, fault=SDC_FAULT, recoverable=False)
        except Exception as exc:  # noqa: BLE001 - the job goes on; say why the node is not recorded
            state = f"not recorded in the node state ({type(exc).__name__}: {exc})"
        self.state = state
        self.console.note(f"quarantining this node ({self.node}): {reason}; node state: {state}")
        self.ledger.emit(
            DecisionTaken(
                ts=self.clock.now(),
                action=SdcNodeAction.QUARANTINE.value,
                reason=f"{reason}; node state: {state}",
                **self.ledger.ctx(),
            ),
            show=False,
        )
        d = exit_after_quarantine(self.node, state, self.world, *self.sizes, hosts=self.job.hosted_stores())
        match d.action:
            case SdcNodeExit.LEAVE:
                self.leaving = d if self.group is not None else None
            case SdcNodeExit.STAY:
                self.console.note(f"this node stays in the running job: {d.reason}")
                ctx = self.ledger.ctx()
                self.ledger.emit(
                    DecisionTaken(ts=self.clock.now(), action=d.action.value, reason=d.reason, **ctx)
                )
            case _:
                assert_never(d.action)

    def leave(self, busy: bool = False) -> AttemptOutcome | None:
        """Stop this node's workers at once and end the attempt ``excluded``, when the quarantine
        decided the node leaves (None: it does not, or not yet: ``busy``, a stop or a re-formation its
        ranks take part in is under way; it leaves once that is over)."""
        d, group = self.leaving, self.group
        if d is None or group is None or busy:
            return None
        self.console.note(f"excluding this node ({self.node}): {d.reason}")
        group.stop(0.0)
        now, ctx = self.clock.now(), self.ledger.ctx()
        self.ledger.emit(DecisionTaken(ts=now, action=d.action.value, reason=d.reason, **ctx), show=False)
        why = f"silent data corruption: node {self.node} excluded"
        self.ledger.emit(WorkersStopped(ts=now, reason=why, **ctx), show=False)
        return AttemptOutcome(
            AttemptStatus.EXCLUDED, detected_at=now, detail=f"corrupting a replica silently ({d.reason})"
        )
