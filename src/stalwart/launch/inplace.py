"""In-place recovery, agent side: replace only the failed ranks and let the survivors re-form.

The supervisor asks :meth:`InPlaceRecovery.consider` before it tears a failed group down. The pure
ladder policy (policy/inplace.py) answers; on ``InPlace`` this module:

1. SIGKILLs the failed ranks (a hung or stopped rank too: its closed connections are what wakes the
   survivors that wait on it in a collective) and starts each again, warm from the fork server when
   it is offered, as generation ``g`` of the same rank;
2. asks every worker through the control block to re-form into generation ``g``;
3. follows the re-formation: every rank reports :class:`~stalwart.protocol.Reformed`; a rank that
   exits, or a re-formation not complete within its bound, falls down the ladder (the supervisor then
   restarts the whole group as it did before, and the ledger says why).

On completion it writes :class:`~stalwart.events.ReformedInPlace` with the phases: detect (fault ->
detection), replace (-> replacements started), abort, wait, rendezvous, transfer (the slowest rank's
worker-side figures) and the bytes moved.

Across nodes (:meth:`InPlaceRecovery.watch`), a node joins the generation another node announced, or
refuses when none comes. A lost node (its heartbeat silent) with no hot spare is shrunk away in place
by the first surviving node (policy :func:`~stalwart.policy.inplace.shrink`): it announces the smaller
world and the surviving nodes' order, and every survivor asks its ranks to join in their new places
(the control block carries each node's first global rank and the world size).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from typing_extensions import assert_never

from ..events import DecisionTaken, ReformedInPlace, WorkersStopped
from ..policy.inplace import (
    InPlace,
    InPlaceCase,
    Join,
    JoinCase,
    NotInPlace,
    Refuse,
    Wait,
    decide,
    hang_culprits,
    join,
)
from ..policy.restart_policy import FailureKind
from ..protocol import PREFIX
from .board_records import Announcement, Board
from .clock import Clock
from .decision import AttemptOutcome, Decision
from .inplace_resize import Invitation, cancel_invitation, grow_group, shrink_group
from .ports import LedgerSink
from .progress import ProgressTracker
from .snapshot import Snapshot
from .workers import WorkerSpec


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of a process (``R``, ``S``, ``D``, ``T``...), "" when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return ""
    tail = raw[raw.rfind(b")") + 2 :]  # the name in parentheses may hold spaces
    return tail[:1].decode(errors="replace")


@dataclass
class Pending:
    decision: Decision  # the failure being recovered (the attempt's outcome if the rung fails)
    plan: InPlace
    started: float  # when the replacements were started
    deadline: float
    done_before: int  # the interrupted step: the lowest step not completed by every rank
    replace_s: float


@dataclass
class InPlaceRecovery:
    """Owns the group's generation and at most one re-formation in progress."""

    cfg: object
    ledger: LedgerSink
    group: object  # launch.workers.WorkerGroup
    receiver: object  # protocol.pipe.Receiver
    block: object  # protocol.control.ControlBlock (writable)
    tracker: ProgressTracker
    num_nodes: int
    attempt: int
    clock: Clock
    generation: int = 0
    used: int = 0  # re-formations started in this attempt
    completed: int = 0  # and completed (failures recovered in place)
    pending: Pending | None = None
    specs: dict[int, WorkerSpec] = field(default_factory=dict)
    read_state: Callable[[int], str] = field(default=lambda pid: proc_state(pid))
    board: Board | None = None  # several nodes: how agents tell each other of a re-formation
    node: str = ""
    refused: bool = False  # this node told its ranks no re-formation is coming (the group restarts)
    world_size: int = 0  # every node's ranks (0: this node's are the whole group)
    spares: bool = False  # the round has hot spares
    said_waiting: bool = False  # this node told the board its ranks wait for an announcement
    taking_over: float | None = None  # a hot spare's ranks replace a lost node's: when they started
    xids: Callable[[], tuple[str, ...]] | None = None  # severe GPU Xids since the attempt started
    active: tuple[str, ...] = ()  # the group's nodes by group rank (a shrink in place drops the lost)
    # this node resized the group in place: ("shrink" | "grow", old world size, interrupted step)
    resized: tuple[str, int, int] | None = None
    inviting: Invitation | None = None  # a grow under way: newcomers start their ranks (first node)
    said_ready: bool = False  # a newcomer's ranks are about to join: this node told the first node
    newcomer: bool = False  # this node's ranks joined a group that grew in place (no failure recovered)
    invited: int = 0  # the newest generation this (first) node invited newcomers to
    given_up: dict[str, int] = field(default_factory=dict)  # node -> its offer whose invitation failed

    def __post_init__(self) -> None:
        if self.xids is None:
            from .gpu_faults import XidWatch

            diagnosis = getattr(self.cfg, "diagnosis", None)
            self.xids = XidWatch(self.clock.now(), getattr(diagnosis, "kernel_log", None))

    def hang_culprits(self, answered: set[int]) -> frozenset[int]:
        """The ranks a hang can be pinned on: stopped ones (``T`` in /proc), else, when most ranks
        answered the stack request, the ones that did not. Empty: nothing tells the hung rank from
        the ranks waiting on it."""
        from .workers import WorkerGroup

        if not isinstance(self.group, WorkerGroup):
            return frozenset()
        states = {r: self.read_state(p.pid) for r, p in self.group.procs.items()}
        return hang_culprits(states, frozenset(answered))

    def consider(self, d: Decision, snap: Snapshot, now: float, hung: frozenset[int] | None = None) -> bool:
        """Decide the first rung for failure ``d``; True when an in-place re-formation has started.
        ``hung``: for a hang, the ranks it is pinned on (:meth:`hang_culprits`)."""
        failure = d.outcome.failure if d.outcome is not None else None
        if failure is None or not any(p.in_place for p in self.tracker.progress.values()):
            return False  # no rank offers in-place (a script without Session.run): the usual restart
        settings = self.cfg.reform  # type: ignore[attr-defined]
        case = InPlaceCase(
            enabled=settings.enabled,
            failure=FailureKind(failure.kind),
            failed=hung if hung is not None else frozenset(self._failed(d, snap)),
            ranks=frozenset(self.tracker.progress),
            in_place_ranks=frozenset(r for r, p in self.tracker.progress.items() if p.in_place),
            num_nodes=self.num_nodes,
            used=self.used,
            allowed=settings.max_per_attempt,
            generation=max(self.generation, self.invited),  # past a grow's invitation, if any
            reforming=self.pending is not None,
            stopping=snap.stop_requested_at is not None,
            forced_failure=settings.fail_attempt == self.attempt,
            xids=self.xids() if self.xids is not None and settings.enabled else (),
            world_size=self.world_size,
        )
        choice = decide(case)
        match choice:
            case NotInPlace(reason=reason):
                self._record("in_place_skipped", reason, now)
                if self.board is not None and not self.refused:  # the other nodes stop waiting for it
                    self.refused = True
                    self.board.refuse(reason)
                    from ..protocol.control import ControlBlock

                    if isinstance(self.block, ControlBlock):
                        self.block.refuse_reform()
                return False
            case InPlace():
                cancel_invitation(self, "a failure during the grow", now)  # its generation is passed
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
        from ..protocol.control import ControlBlock
        from ..protocol.pipe import Receiver
        from .workers import WorkerGroup

        assert isinstance(self.group, WorkerGroup) and isinstance(self.receiver, Receiver)
        assert isinstance(self.block, ControlBlock)
        self._record("in_place", plan.reason, now)
        bound = self.cfg.reform.timeout_s  # type: ignore[attr-defined]
        # the interrupted step: the lowest one not completed by every rank (the failed ones included,
        # before their progress is reset for the replacements)
        interrupted = min((q.last_done + 1 for q in self.tracker.progress.values()), default=0)
        try:
            for rank in sorted(plan.ranks):
                spec = self.specs[rank]
                fd = self.receiver.new_channel()
                env = {
                    **spec.env,
                    f"{PREFIX}GENERATION": str(plan.generation),
                    f"{PREFIX}IPC": str(fd),
                }
                new = dataclasses.replace(spec, env=env, ipc_fd=fd)
                try:
                    self.group.replace(new, reap_s=bound)
                finally:
                    os.close(fd)
                self.specs[rank] = new
                self.tracker.replace(rank, now)
        except (RuntimeError, OSError) as exc:
            self._record("in_place_failed", f"replacing rank failed: {exc}", now)
            return False
        self.generation = plan.generation
        self.used += 1
        self.block.request_reform(plan.generation)
        if self.board is not None:  # the other nodes' ranks lost this peer too: they join this generation
            self.board.announce(Announcement(plan.generation, self.node, tuple(sorted(plan.ranks))))
        started = self.clock.now()
        self.pending = Pending(d, plan, started, started + 3 * bound, interrupted, started - now)
        return True

    def watch(self, snap: Snapshot) -> None:
        """A tick on a node of a multi-node group: join another node's in-place re-formation, or, when
        none is announced within the bound after a local rank lost a peer, tell the local ranks none is
        coming (they exit with their communication error, and the group restarts whole)."""
        if self.taking_over is not None:
            self._say_ready()
            self._took_over(snap.now)
        if self.board is None or self.refused:
            return
        seen = self.board.latest()
        waiting = [
            q.reforming.t
            for q in self.tracker.progress.values()
            if q.reforming is not None and q.reforming.generation > self.generation
        ]
        settings = self.cfg.reform  # type: ignore[attr-defined]
        refused = self.board.refusal()
        silent = self.board.silence()
        lost = tuple(n for n in self.active or tuple(silent) if silent.get(n, 0.0) >= settings.announce_s / 2)
        newer = seen is not None and seen.generation > self.generation  # another node's, to join instead
        if waiting and lost and not newer and self.pending is None and shrink_group(self, lost, silent, snap):
            return
        if (waiting or newer) and self.inviting is not None:
            cancel_invitation(self, "a failure during the grow", snap.now)
        if not waiting and not newer and grow_group(self, snap):
            return
        resized = seen.world_size if seen is not None and newer else 0
        grown = resized if resized > self.world_size > 0 else 0
        case = JoinCase(
            enabled=settings.enabled,
            generation=self.generation,
            announced=seen.generation if seen is not None else 0,
            announced_by=seen.node if seen is not None else "",
            waiting_since=min(waiting) if waiting else None,
            now=snap.now,
            bound_s=settings.announce_s,
            busy=self.pending is not None,
            stopping=snap.stop_requested_at is not None,
            refused_by=refused[0] if refused is not None and refused[0] != self.node else "",
            refused_why=refused[1] if refused is not None else "",
            lost=lost,
            spares=self.spares,
            shrunk_to=resized if resized and not grown else 0,
            grown_to=grown,
        )
        choice = join(case)
        match choice:
            case Wait():
                if waiting and not self.said_waiting and not case.busy:  # a hot spare may take the lost place
                    self.said_waiting = True
                    self.board.waiting(self.generation + 1)
            case Join(generation=gen, reason=reason):
                if seen is not None and seen.world_size and self.node not in seen.active:
                    self._refuse(f"node {seen.node} shrank the group in place without this node", snap.now)
                    return
                self._join(gen, seen, reason, snap.now)
            case Refuse(reason=reason):
                self._refuse(reason, snap.now, tell=not case.refused_by)  # the others stop waiting too
            case _:
                assert_never(choice)

    def _refuse(self, reason: str, now: float, tell: bool = True) -> None:
        """Tell the local ranks no re-formation is coming (and, with ``tell``, the other nodes)."""
        from ..protocol.control import ControlBlock

        assert isinstance(self.block, ControlBlock) and self.board is not None
        self.refused = True
        self.block.refuse_reform()
        if tell:
            self.board.refuse(reason)
        self._record("in_place_skipped", reason, now)

    def _join(
        self, gen: int, seen: Announcement | None, reason: str, now: float, record: bool = True
    ) -> None:
        """Ask the local ranks to join generation ``gen``, in their new place when the group shrank or
        grew."""
        from ..protocol.control import ControlBlock

        assert isinstance(self.block, ControlBlock)
        place = None
        if seen is not None and seen.world_size:  # the group resized: this node's new place in it
            place = seen.place(self.node, self.cfg.nproc_per_node)  # type: ignore[attr-defined]
        if seen is not None and place is not None:
            self.active, self.world_size, self.num_nodes = seen.active, seen.world_size, len(seen.active)
        self.generation = gen
        self.said_waiting = False
        self.block.request_reform(gen, place)
        if record:
            self._record("joined_in_place", reason, now)

    def _say_ready(self) -> None:
        """A newcomer's (or a spare's) ranks are all about to join their generation: tell the first
        node, which re-forms the group with them only then (launch/inplace_resize.py)."""
        if self.said_ready or self.board is None:
            return
        progress = self.tracker.progress.values()
        if progress and all(q.reforming and q.reforming.generation == self.generation for q in progress):
            self.said_ready = True
            self.board.ready(self.generation)

    def _took_over(self, now: float) -> None:
        """A hot spare's ranks joined the other nodes' generation with the live state: the record of
        the lost node's recovery in place. Survivors keep their last completed step (a data-parallel
        step completes on every rank or on none), so nothing beyond the interrupted step is redone."""
        progress = self.tracker.progress
        msgs = [
            q.reformed for q in progress.values() if q.reformed and q.reformed.generation == self.generation
        ]
        if len(msgs) < len(progress) or self.taking_over is None:
            return
        kind, old, interrupted = (
            self.resized if self.resized is not None else ("", 0, max(m.step for m in msgs))
        )
        first = "join" if kind else "replace"  # a resize starts no rank here
        phases = {first: max(0.0, min(m.t for m in msgs) - self.taking_over)}
        for name in ("rendezvous", "transfer"):
            phases[name] = max((m.phases.get(name, 0.0) for m in msgs), default=0.0)
        self.taking_over = None
        if kind != "grow" and not self.newcomer:  # a grow recovers no failure: the count stays
            self.completed += 1
        step = max(m.step for m in msgs)
        self.resized = None
        match kind:
            case "shrink":
                ranks: tuple[int, ...] = ()  # a shrink replaced no rank
            case "grow":
                ranks = tuple(range(old, self.world_size))  # the newcomers' ranks
            case _:
                ranks = tuple(sorted(progress))
        self.ledger.emit(
            ReformedInPlace(
                ts=now,
                generation=self.generation,
                ranks=ranks,
                step=step,
                lost_steps=max(0, interrupted - step),
                bytes_moved=sum(m.received for m in msgs),
                state_bytes=max(m.received for m in msgs),
                phases=phases,
                world_size=self.world_size if kind else 0,
                shrunk_from=old if kind == "shrink" else 0,
                grown_from=old if kind == "grow" else 0,
                **self.ledger.ctx(),
            )
        )

    def follow(self, snap: Snapshot) -> Decision | None:
        """A tick during a re-formation: None while it goes on or once it completed; the original
        failure's decision when the rung failed (the supervisor then restarts the whole group)."""
        p = self.pending
        if p is None:
            return None
        progress = self.tracker.progress
        exited = sorted(r for r, c in snap.codes.items() if c is not None)
        if exited:
            return self._fail(
                f"rank {', '.join(map(str, exited))} exited during the in-place re-formation", snap
            )
        joined = {
            r: q.reformed
            for r, q in progress.items()
            if q.reformed and q.reformed.generation == p.plan.generation
        }
        if len(joined) == len(progress):
            self._complete(p, joined, snap.now)
            return None
        if snap.now >= p.deadline:
            missing = sorted(set(progress) - set(joined))
            return self._fail(
                f"ranks {', '.join(map(str, missing))} did not join generation {p.plan.generation} "
                f"within {p.deadline - p.started:.0f}s",
                snap,
            )
        return None

    def _complete(self, p: Pending, joined: dict, now: float) -> None:
        self.pending = None
        self.completed += 1
        msgs = list(joined.values())
        step = max(m.step for m in msgs)
        phases = {
            "detect": max(0.0, p.decision.outcome.detected_at - p.decision.onset)
            if p.decision.outcome and p.decision.onset
            else 0.0
        }
        phases["replace"] = p.replace_s
        for name in ("abort", "wait", "rendezvous", "transfer"):
            vals = [m.phases.get(name, 0.0) for m in msgs if name in m.phases]
            phases[name] = max(vals) if vals else 0.0
        moved = sum(m.received for m in msgs)
        ctx = self.ledger.ctx()
        self.ledger.emit(
            ReformedInPlace(
                ts=now,
                generation=p.plan.generation,
                ranks=tuple(sorted(p.plan.ranks)),
                step=step,
                lost_steps=max(0, p.done_before - step),
                bytes_moved=moved,
                state_bytes=max((m.received for m in msgs), default=0),
                phases=phases,
                **ctx,
            )
        )

    def _fail(self, reason: str, snap: Snapshot) -> Decision:
        p = self.pending
        assert p is not None
        self.pending = None
        self._record("in_place_failed", reason, snap.now)
        return p.decision

    def fall_back(self, d: Decision) -> AttemptOutcome:
        """The re-formation failed (its reason is in the ledger): stop the group; the attempt ends with
        the original failure, and the job policy restarts the whole group as without the in-place rung."""
        assert d.outcome is not None
        self.group.stop(0.0)  # type: ignore[attr-defined]
        reason = "in-place recovery failed: the whole group restarts"
        self.ledger.emit(WorkersStopped(ts=self.clock.now(), reason=reason, **self.ledger.ctx()), show=False)
        return d.outcome

    def _record(self, action: str, reason: str, now: float) -> None:
        self.ledger.emit(DecisionTaken(ts=now, action=action, reason=reason, **self.ledger.ctx()))
