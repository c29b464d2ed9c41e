"""In-place recovery, agent side: the first rung for a local failure, and the supervisor's one entry.

The supervisor calls :meth:`InPlaceRecovery.tick` once a tick and asks
:meth:`InPlaceRecovery.consider` before it tears a failed group down. The pure ladder policy
(policy/inplace.py ``decide``) answers; on ``InPlace`` this module steps the in-place machine
(launch/inplace/machine.py, ``replacing``) and acts:

1. SIGKILLs the failed ranks (a hung or stopped rank too: its closed connections are what wakes the
   survivors that wait on it in a collective) and starts each again, warm from the fork server when
   it is offered, as generation ``g`` of the same rank;
2. asks every worker through the control block to re-form into generation ``g`` (and, with several
   nodes, announces ``g`` on the board);
3. follows the re-formation (:meth:`~InPlaceRecovery.follow`): every rank reports
   :class:`~stalwart.protocol.Reformed`; a rank that exits, or a re-formation not complete within
   its bound, falls down the ladder (the whole group restarts, and the ledger says why).

It holds no flag of its own: "is a re-formation under way?" is the machine's phase. The moves that
other nodes take part in (join, refuse, shrink, grow, take-over) are launch/inplace/nodes.py, which
this class builds on; the records of a completed recovery are launch/inplace/records.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from typing_extensions import assert_never

from ...diagnose.hang import waits_in_collective
from ...events import WorkersStopped
from ...policy.hang_pin import HangCulprits, hang_culprits
from ...policy.inplace import InPlace, InPlaceCase, NotInPlace, decide, not_offered
from ...policy.vocabulary import FailureKind
from ...protocol import PREFIX
from ...protocol.control import ControlBlock
from ...protocol.pipe import Receiver
from ..decision import AttemptOutcome, Decision
from ..processes.worker_group import WorkerGroup
from ..snapshot import Snapshot
from . import records as inplace_records
from .board_records import Announcement
from .machine import Invitation, Pending, Phase, Reformed, Replaced, ReplaceFailed
from .nodes import NodeRecovery, proc_state

__all__ = ["InPlaceRecovery", "Invitation", "Pending", "proc_state"]


class InPlaceRecovery(NodeRecovery):
    """Replaces this node's failed ranks in place, and drives the machine once a tick."""

    def tick(self, snap: Snapshot) -> AttemptOutcome | None:
        """One supervisor tick: watch the other nodes, follow this node's re-formation; the attempt's
        outcome when the re-formation failed (the whole group then restarts), else None."""
        self.watch(snap)
        if self.state.phase is not Phase.REPLACING:
            return None
        failed = self.follow(snap)
        return self.fall_back(failed) if failed is not None else None

    # --- a local failure ---------------------------------------------------------------------------

    def hang_culprits(self, stacks: Mapping[int, str]) -> HangCulprits:
        """The ranks a hang can be pinned on (policy/hang_pin.py ``hang_culprits``): stopped ones
        (``T`` in /proc), else, when most ranks answered the stack request (``stacks``), the ones
        whose stacks stand outside any collective while others wait in one, else the ones that did
        not answer. No ranks: nothing tells the hung rank from the ranks waiting on it."""

        procs = self.group.procs
        # the kernel's state of real processes only (a test's group has made-up pids: unknown)
        real = isinstance(self.group, WorkerGroup)
        states = {r: self.read_state(p.pid) if real else "" for r, p in procs.items()}
        waiting = frozenset(r for r, text in stacks.items() if waits_in_collective(text))
        return hang_culprits(states, frozenset(stacks), waiting)

    def consider(self, d: Decision, snap: Snapshot, now: float, hung: frozenset[int] | None = None) -> bool:
        """Decide the first rung for failure ``d``; True when an in-place re-formation has started.
        ``hung``: for a hang, the ranks it is pinned on (:meth:`hang_culprits`)."""
        failure = d.outcome.failure if d.outcome is not None else None
        if failure is None:
            return False
        settings = self.cfg.reform
        if not any(p.in_place for p in self.tracker.progress.values()):
            # no rank offers in-place (a script without Session.run): the usual restart, and why
            session = any(p.session for p in self.tracker.progress.values())
            silent = not_offered(settings.enabled, FailureKind(failure.kind), session)
            if silent is not None:
                self.record("in_place_skipped", silent.reason, now)
            return False
        s = self.state
        case = InPlaceCase(
            enabled=settings.enabled,
            failure=FailureKind(failure.kind),
            failed=hung if hung is not None else frozenset(self._failed(d, snap)),
            ranks=frozenset(self.tracker.progress),
            in_place_ranks=frozenset(r for r, p in self.tracker.progress.items() if p.in_place),
            num_nodes=s.num_nodes,
            used=s.used,
            allowed=settings.max_per_attempt,
            generation=s.next_generation_base,
            reforming=s.phase is Phase.REPLACING,
            stopping=snap.stop_requested_at is not None,
            forced_failure=settings.fail_attempt == self.attempt,
            xids=self.xids() if self.xids is not None and settings.enabled else (),
            world_size=s.world_size,
        )
        choice = decide(case)
        match choice:
            case NotInPlace(reason=reason):
                self.record("in_place_skipped", reason, now)
                if self.board is not None and s.phase is not Phase.REFUSED:  # the others stop waiting
                    self.refuse(reason, now, record=False)
                return False
            case InPlace():
                if s.phase is Phase.REFUSED:  # the ranks were told no re-formation comes
                    why = "this node already said the group restarts whole"
                    self.record("in_place_skipped", why, now)
                    return False
                self.give_up_grow("a failure during the grow", now)  # its generation is passed
                return self._start(d, snap, choice, now)
            case _:
                assert_never(choice)

    def _failed(self, d: Decision, snap: Snapshot) -> set[int]:
        """The ranks to replace: every rank that exited with a failure, and the decision's own rank."""
        out = {r for r, c in snap.codes.items() if c not in (None, 0)}
        if d.rank is not None and d.rank >= 0:
            out.add(d.rank)
        return out

    def _start(self, d: Decision, snap: Snapshot, plan: InPlace, now: float) -> bool:

        assert isinstance(self.group, WorkerGroup) and isinstance(self.receiver, Receiver)
        assert isinstance(self.block, ControlBlock)
        self.record("in_place", plan.reason, now)
        bound = self.cfg.reform.timeout_s
        # the interrupted step: the lowest one not completed by every rank (the failed ones included,
        # before their progress is reset for the replacements)
        interrupted = self.interrupted()
        try:
            for rank in sorted(plan.ranks):
                spec = self.specs[rank]
                fd = self.receiver.new_channel()
                env = {**spec.env, f"{PREFIX}GENERATION": str(plan.generation), f"{PREFIX}IPC": str(fd)}
                new = dataclasses.replace(spec, env=env, ipc_fd=fd)
                try:
                    self.group.replace(new, reap_s=bound)
                finally:
                    os.close(fd)
                self.specs[rank] = new
                self.tracker.replace(rank, now)
        except (RuntimeError, OSError) as exc:
            self.record("in_place_failed", f"replacing rank failed: {exc}", now)
            return False
        started = self.clock.now()
        self.apply(Replaced(Pending(d, plan, started, started + 3 * bound, interrupted, started - now)))
        self.block.request_reform(plan.generation)
        if self.board is not None:  # the other nodes' ranks lost this peer too: they join this generation
            self.board.announce(Announcement(plan.generation, self.node, tuple(sorted(plan.ranks))))
        return True

    def follow(self, snap: Snapshot) -> Decision | None:
        """A tick during a re-formation: None while it goes on or once it completed; the original
        failure's decision when the rung failed (the supervisor then restarts the whole group)."""
        p = self.state.pending
        if p is None:
            return None
        progress = self.tracker.progress
        exited = sorted(r for r, c in snap.codes.items() if c is not None)
        if exited:
            why = f"rank {', '.join(map(str, exited))} exited during the in-place re-formation"
            return self._fail(p, why, snap.now)
        gen = p.plan.generation
        joined = [q.reformed for q in progress.values() if q.reformed and q.reformed.generation == gen]
        if len(joined) == len(progress):
            self.ledger.emit(inplace_records.replaced(p, joined, snap.now, self.ledger.ctx()))
            self.apply(Reformed())
            return None
        if snap.now >= p.deadline:
            done = {r for r, q in progress.items() if q.reformed and q.reformed.generation == gen}
            missing = ", ".join(map(str, sorted(set(progress) - done)))
            return self._fail(
                p,
                f"ranks {missing} did not join generation {gen} within {p.deadline - p.started:.0f}s",
                snap.now,
            )
        return None

    def _fail(self, p: Pending, reason: str, now: float) -> Decision:
        self.apply(ReplaceFailed())
        self.record("in_place_failed", reason, now)
        return p.decision

    def fall_back(self, d: Decision) -> AttemptOutcome:
        """The re-formation failed (its reason is in the ledger): stop the group; the attempt ends with
        the original failure, and the job policy restarts the whole group as without the in-place rung."""
        assert d.outcome is not None
        self.group.stop(0.0)
        reason = "in-place recovery failed: the whole group restarts"
        self.ledger.emit(WorkersStopped(ts=self.clock.now(), reason=reason, **self.ledger.ctx()), show=False)
        return d.outcome
