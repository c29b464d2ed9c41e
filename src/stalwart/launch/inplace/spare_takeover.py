"""A hot spare that takes a lost node's place in place (docs/fast-recovery.md, "Across nodes").

While it stands by, the spare's agent reads the round's worker store through a
:class:`~stalwart.launch.inplace.board.StoreBoard` that watches the active nodes' heartbeats. The
pure policy (:func:`stalwart.policy.inplace.take_over`) says when a node is lost and which spare
takes its place; the spare then claims that place in the store (compare-and-set, so two spares never
take the same one), and, holding the claim, announces the next generation with the lost node's
ranks. The other nodes' agents join that generation as they join any node's in-place re-formation;
the spare starts the lost node's ranks as replacements of that generation, and they receive the live
state from a replica. Every store call runs on the board's thread: :meth:`SpareWatch.poll` never
waits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from typing_extensions import assert_never

from ...events import DecisionTaken, FailureDetected
from ...job_key import Signer
from ...policy.inplace import TakeOver, TakeOverCase, Wait, take_over
from ...policy.job import TookOver
from ...policy.world_size import WorldPlan
from ...settings.run_config import RunConfig
from ..ports import Round
from ..rendezvous.node_rendezvous import local_addr
from .board import Announcement, StoreBoard


@dataclass
class SpareWatch:
    cfg: RunConfig
    board: StoreBoard
    plan: WorldPlan
    claiming: TakeOver | None = None
    generation: int = 0  # the generation this spare's ranks join, once it took a place
    silent_s: float = 0.0  # how long the lost node's heartbeat had not moved when its place was taken
    dead_s: float | None = None  # seconds since its agent's liveness connection closed (None: not dead)
    left: bool = False  # its agent left the job on purpose (it excluded its own node)

    @classmethod
    def open(cls, cfg, plan: WorldPlan, met: Round, note, signer: Signer) -> SpareWatch:
        board = StoreBoard(
            met.addr,
            met.port,
            cfg.rendezvous.store_timeout_s,
            note,
            node=cfg.node_name,
            watch=plan.active,
            signer=signer,
            live_host=cfg.rendezvous.local_addr or local_addr(cfg.rendezvous.endpoint),
        )
        return cls(cfg, board, plan)

    def poll(self) -> TookOver | None:
        """The plan with this spare in the lost node's place once the claim is held, else None."""
        cfg, board = self.cfg, self.board
        me = cfg.node_name
        if self.claiming is None:
            settings = cfg.reform
            case = TakeOverCase(
                enabled=settings.enabled,
                spare=me,
                spares=self.plan.spares,
                active=self.plan.active,
                silent=board.silence(),
                waiting=frozenset(board.nodes_waiting()),
                bound_s=settings.announce_s / 2,  # decided before the waiting ranks give up
                dead=frozenset(board.dead()),
                left=board.left(),
            )
            choice = take_over(case)
            match choice:
                case Wait():
                    return None
                case TakeOver():
                    self.claiming = choice
                    board.claim(choice.lost)
                    return None
                case _:
                    assert_never(choice)
        holder = board.claimed_by(self.claiming.lost)
        if holder is None:
            return None  # the store has not answered yet
        if holder != me:  # another spare holds it: stand by again
            self.claiming = None
            return None
        lost = self.claiming
        self.silent_s = board.silence().get(lost.lost, 0.0)
        self.dead_s = board.dead().get(lost.lost)
        self.left = lost.lost in board.left()
        seen = board.latest()
        self.generation = (seen.generation if seen is not None else 0) + 1
        nproc = self.plan.nproc_per_node
        ranks = tuple(range(lost.group_rank * nproc, (lost.group_rank + 1) * nproc))
        board.announce(Announcement(self.generation, me, ranks))
        active = tuple(me if n == lost.lost else n for n in self.plan.active)
        plan = replace(
            self.plan,
            active=active,
            spares=tuple(n for n in self.plan.spares if n != me),
            reason=lost.reason,
        )
        return TookOver(plan, lost.reason)

    def close(self) -> None:
        self.board.close()


def lost_node_records(cfg, ledger, now: float, took: TookOver, watch: SpareWatch) -> None:
    """The lost node's failure, as the spare that took its place detected it, and the in-place rung
    it takes."""
    assert watch.claiming is not None
    ctx = ledger.ctx()
    first = took.plan.active.index(cfg.node_name) * cfg.nproc_per_node
    ledger.emit(
        FailureDetected(
            ts=now,
            failure="agent_lost",
            evidence=f"node {watch.claiming.lost}: "
            + (
                "its agent left the job on purpose (it excluded its own node) while its peers wait"
                if watch.left
                else "its agent's process is gone (its liveness connection closed) while its peers wait"
                if watch.dead_s is not None
                else f"no heartbeat for {watch.silent_s:.1f}s while its peers wait"
            ),
            onset=now - (watch.dead_s if watch.dead_s is not None else watch.silent_s),
            rank=first,
            **ctx,
        )
    )
    ledger.emit(DecisionTaken(ts=now, action="in_place", reason=took.reason, **ctx))
