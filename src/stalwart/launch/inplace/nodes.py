"""In-place recovery across nodes: the moves of the in-place machine that other nodes take part in.

:class:`NodeRecovery` holds the machine's state (launch/inplace/machine.py) for one attempt and
applies its transitions; it decides with the pure policies (policy/inplace.py over
policy/membership.py) and acts through the board the nodes share, the control block and the ledger:

* join the generation another node announced, or tell the local ranks none is coming (they exit with
  their communication error and the group restarts whole);
* on the group's first node, **shrink** a lost node away when the round has no hot spare: the
  surviving nodes keep their processes and re-form at the smaller world size in their old order;
* on the group's first node, **grow** the group back when nodes offer a free place
  (launch/inplace/rejoin.py): first an invitation (the newcomers start their ranks in the next generation
  while the group trains on), then, once every newcomer's ranks are ready, the announcement: the
  nodes in the group re-form at the next step boundary and a replica sends the newcomers the state;
* a hot spare's or a newcomer's ranks that start in a generation: tell the first node they are ready,
  and record the join once every local rank joined.

The local-failure rung (replace the failed ranks of this node) is launch/inplace/recovery.py, built on this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from typing_extensions import assert_never

from ...events import DecisionTaken
from ...policy.inplace import (
    GrowCase,
    GrowInPlace,
    Join,
    JoinCase,
    Refuse,
    ShrinkCase,
    ShrinkInPlace,
    Wait,
    grow,
    join,
    shrink,
)
from ...policy.membership import lost_nodes
from ...policy.world_size import SizeRule
from ...protocol.control import ControlBlock
from ...settings.recovery import InPlaceSettings
from ..clock import Clock
from ..gpu_faults import XidWatch
from ..ports import ControlWrites, Inbox, LedgerSink, WorkerProcesses
from ..processes.worker_group import WorkerSpec
from ..progress import ProgressTracker
from ..snapshot import Snapshot
from . import records as inplace_records
from .board_records import Announcement, Board
from .machine import (
    JOINING,
    Group,
    GrowGivenUp,
    Grown,
    Illegal,
    InPlaceState,
    Invitation,
    Invited,
    Joined,
    NewcomerStarted,
    PeerLost,
    Pending,
    Phase,
    ReadyTold,
    Reformed,
    Refused,
    Resize,
    Resized,
    Shrunk,
    TakeoverStarted,
    Trigger,
    TriggerKind,
    allows,
    step,
)


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of a process (``R``, ``S``, ``D``, ``T``...), "" when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return ""
    tail = raw[raw.rfind(b")") + 2 :]  # the name in parentheses may hold spaces
    return tail[:1].decode(errors="replace")


class RecoverySettings(Protocol):
    """What in-place recovery reads from a run's settings: the run configuration, or the simulator's
    ProbeConfig (sim/agent_probe.py); a ``diagnosis`` part is optional (its kernel log feeds the Xids)."""

    @property
    def reform(self) -> InPlaceSettings: ...

    @property
    def nproc_per_node(self) -> int: ...

    @property
    def min_nodes(self) -> int: ...

    @property
    def max_nodes(self) -> int: ...

    @property
    def size_rule(self) -> SizeRule: ...


class NodeRecovery:
    """The machine's state for one attempt, and the moves that involve other nodes."""

    def __init__(
        self,
        cfg: RecoverySettings,
        ledger: LedgerSink,
        group: WorkerProcesses,
        receiver: Inbox,
        block: ControlWrites,
        tracker: ProgressTracker,
        num_nodes: int,
        attempt: int,
        clock: Clock,
        *,
        specs: dict[int, WorkerSpec] | None = None,
        read_state: Callable[[int], str] = proc_state,
        board: Board | None = None,  # several nodes: how agents tell each other of a re-formation
        node: str = "",
        world_size: int = 0,  # every node's ranks (0: this node's are the whole group)
        active: tuple[str, ...] = (),  # the group's nodes by group rank
        spares: bool = False,  # the round has hot spares
        xids: Callable[[], tuple[str, ...]] | None = None,  # severe GPU Xids since the attempt started
    ) -> None:
        self.cfg, self.ledger, self.group, self.receiver, self.block = cfg, ledger, group, receiver, block
        self.tracker, self.attempt, self.clock = tracker, attempt, clock
        self.specs = dict(specs or {})
        self.read_state, self.board, self.node = read_state, board, node
        self.state = InPlaceState(active=active, world_size=world_size, num_nodes=num_nodes, spares=spares)
        if xids is None:
            diagnosis = getattr(cfg, "diagnosis", None)
            xids = XidWatch(clock.now(), getattr(diagnosis, "kernel_log", None))
        self.xids = xids

    # --- the machine -------------------------------------------------------------------------------

    def apply(self, trigger: Trigger) -> InPlaceState:
        """Step the machine; an illegal move is a bug of this executor, never a runtime condition."""
        got = step(self.state, trigger)
        if isinstance(got, Illegal):
            raise RuntimeError(f"in-place machine: {got.reason}")
        self.state = got
        return got

    @property
    def phase(self) -> Phase:
        return self.state.phase

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def completed(self) -> int:
        return self.state.completed

    @property
    def world_size(self) -> int:
        return self.state.world_size

    @property
    def active(self) -> tuple[str, ...]:
        return self.state.active

    @property
    def num_nodes(self) -> int:
        return self.state.num_nodes

    @property
    def pending(self) -> Pending | None:
        return self.state.pending

    @property
    def reforming(self) -> bool:
        """This node's own replacements re-form (a hang meanwhile is the re-formation's to bound)."""
        return self.state.phase is Phase.REPLACING

    def start_joining(self, generation: int, now: float, newcomer: bool) -> None:
        """This node's ranks start in ``generation``: a hot spare's in a lost node's place, or a
        newcomer's in the place the group's first node invited it to."""
        self.apply(NewcomerStarted(generation, now) if newcomer else TakeoverStarted(generation, now))

    # --- across nodes ------------------------------------------------------------------------------

    def watch(self, snap: Snapshot) -> None:
        """A tick on a node of a multi-node group: finish a join under way, shrink or grow the group
        (its first node), join another node's re-formation, or, when none is announced within the
        bound after a local rank lost a peer, tell the local ranks none is coming (they exit with their
        communication error, and the group restarts whole)."""
        self._joins_done(snap.now)
        if self.board is None or self.state.phase is Phase.REFUSED:
            return
        s, board = self.state, self.board
        seen = board.latest()
        waiting = [
            q.reforming.t
            for q in self.tracker.progress.values()
            if q.reforming is not None and q.reforming.generation > s.generation
        ]
        settings = self.cfg.reform
        silent, dead = board.silence(), board.dead()
        lost = lost_nodes(s.active or tuple(silent), silent, settings.announce_s / 2, dead=frozenset(dead))
        newer = seen is not None and seen.generation > s.generation  # another node's, to join instead
        # a lost node is decided by its heartbeat bound (or its closed liveness line), whether or not
        # the local ranks noticed: a host gone silent resets no connection, so they wait in a collective
        # with it, and the re-form request is what unblocks them (train/inplace.py StuckStep)
        if (
            lost
            and not newer
            and s.phase is not Phase.REPLACING
            and self._shrink(lost, silent, dead, snap, waiting)
        ):
            return
        if waiting or newer:
            self.give_up_grow("a failure during the grow", snap.now)
        elif self._grow(snap):
            return
        self._join_orrefuse(seen if newer else None, seen, waiting, lost, snap)

    def _join_orrefuse(
        self,
        newer: Announcement | None,
        seen: Announcement | None,
        waiting: list[float],
        lost: tuple[str, ...],
        snap: Snapshot,
    ) -> None:
        assert self.board is not None
        s, settings = self.state, self.cfg.reform
        refused = self.board.refusal()
        resized = newer.world_size if newer is not None else 0
        grown = resized if resized > s.world_size > 0 else 0
        case = JoinCase(
            enabled=settings.enabled,
            generation=s.generation,
            announced=seen.generation if seen is not None else 0,
            announced_by=seen.node if seen is not None else "",
            waiting_since=min(waiting) if waiting else None,
            now=snap.now,
            bound_s=settings.announce_s,
            busy=s.phase is Phase.REPLACING,
            stopping=snap.stop_requested_at is not None,
            refused_by=refused[0] if refused is not None and refused[0] != self.node else "",
            refused_why=refused[1] if refused is not None else "",
            lost=lost,
            spares=s.spares,
            shrunk_to=resized if resized and not grown else 0,
            grown_to=grown,
        )
        choice = join(case)
        match choice:
            case Wait():  # a hot spare may take the lost place: it acts on the nodes that wait
                if (waiting or lost) and allows(s.phase, TriggerKind.PEER_LOST):
                    self.apply(PeerLost())
                    self.board.waiting(s.generation + 1)
            case Join(generation=gen, reason=reason):
                if seen is not None and seen.world_size and self.node not in seen.active:
                    self.refuse(f"node {seen.node} shrank the group in place without this node", snap.now)
                    return
                self._join(gen, seen, reason, snap.now)
            case Refuse(reason=reason):
                self.refuse(reason, snap.now, tell=not case.refused_by)  # the others stop waiting too
            case _:
                assert_never(choice)

    def _joins_done(self, now: float) -> None:
        """Every local rank joined the generation this node re-forms into without replacing ranks of
        its own: back to training (recorded when this node took over, started, shrank or grew)."""
        s = self.state
        if s.phase not in JOINING and s.phase is not Phase.FOLLOWING:
            return
        if s.phase in (Phase.NEWCOMER_STARTING, Phase.TAKING_OVER):
            self._say_ready()
        progress = self.tracker.progress
        msgs = [q.reformed for q in progress.values() if q.reformed and q.reformed.generation == s.generation]
        if not msgs or len(msgs) < len(progress):
            return
        if s.phase in JOINING:
            self.ledger.emit(inplace_records.joined(s, tuple(progress), msgs, now, self.ledger.ctx()))
        self.apply(Reformed())

    def _say_ready(self) -> None:
        """A newcomer's (or a spare's) ranks are all about to join their generation: tell the first
        node, which re-forms the group with them only then (:meth:`_follow_invitation`)."""
        if self.state.said_ready or self.board is None:
            return
        progress = self.tracker.progress.values()
        gen = self.state.generation
        if progress and all(q.reforming and q.reforming.generation == gen for q in progress):
            self.apply(ReadyTold())
            self.board.ready(gen)

    def _shrink(
        self,
        lost: tuple[str, ...],
        silent: dict[str, float],
        dead: dict[str, float],
        snap: Snapshot,
        waiting: list[float],
    ) -> bool:
        """A lost node and no hot spare: re-form the survivors in place at the smaller size (announced,
        then joined like any generation), or refuse; False when another node (or a spare) decides."""
        cfg, s = self.cfg, self.state
        left = self.board.left().intersection(lost) if self.board is not None else frozenset()
        choice = shrink(
            ShrinkCase(
                enabled=cfg.reform.enabled,
                stopping=snap.stop_requested_at is not None,
                node=self.node,
                active=s.active,
                lost=lost,
                spares=s.spares,
                nproc_per_node=cfg.nproc_per_node,
                min_nodes=cfg.min_nodes,
                rule=cfg.size_rule,
                generation=s.next_generation_base,
                silent=silent,
                dead=frozenset(dead).intersection(lost),
                left=left,
            )
        )
        match choice:
            case Wait():
                return False
            case Refuse(reason=reason):
                self.refuse(reason, snap.now)
            case ShrinkInPlace(active=active, world_size=world, generation=gen, reason=reason):
                self.give_up_grow("a node was lost during the grow", snap.now)
                dropped = tuple(n for n in s.active if n in lost)
                nproc = cfg.nproc_per_node
                ctx = self.ledger.ctx()
                for ev in inplace_records.lost_without_spare(
                    dropped,
                    self.node,
                    s.active,
                    silent,
                    nproc,
                    snap.now,
                    ctx,
                    dead=dead,
                    left=left,
                    waited=bool(waiting),  # this node's ranks reported waiting (else: blocked in a step)
                ):
                    self.ledger.emit(ev)
                self.record("shrink_in_place", reason, snap.now)
                old = s.world_size
                self._announce(Announcement(gen, self.node, (), world, active), Resize.SHRINK, old)
            case _:
                assert_never(choice)
        return True

    def _grow(self, snap: Snapshot) -> bool:
        """Nodes offered a free place: invite them; once every newcomer's ranks are ready, re-form the
        group with them at the next step boundary. The group trains on while the newcomers start (their
        processes, imports and set-up), so the pause is the re-formation alone. False when nothing is
        under way (no offer, not the first node, an incident or re-formation under way, no valid size)."""
        board, s = self.board, self.state
        if board is None or not s.active or s.active[0] != self.node:
            return False
        if s.invitation is not None:
            return self._follow_invitation(s.invitation, snap)
        # an offer whose invitation was given up stands until that node offers anew (it starts again)
        offers = tuple(n for n in board.offers() if s.gave_up(n) != board.offer_seq(n))
        if not offers:
            return False
        cfg = self.cfg
        settings = cfg.reform
        choice = grow(
            GrowCase(
                enabled=settings.enabled,
                stopping=snap.stop_requested_at is not None,
                busy=s.phase in JOINING or s.phase in (Phase.REPLACING, Phase.REFUSED),
                node=self.node,
                active=s.active,
                offers=offers,
                nproc_per_node=cfg.nproc_per_node,
                max_nodes=cfg.max_nodes,
                rule=cfg.size_rule,
                # past any generation invited before: a readiness left from a given-up invitation is stale
                generation=s.next_generation_base,
            )
        )
        match choice:
            case Wait():
                return False
            case GrowInPlace(active=active, joining=joining, world_size=world, generation=gen, reason=reason):
                if not allows(s.phase, TriggerKind.INVITED):
                    return False
                old = s.world_size
                self.record("grow_in_place", reason, snap.now)
                invited = Announcement(gen, self.node, tuple(range(old, world)), world, active)
                board.invite(invited)
                bound = float(settings.timeout_s)
                self.apply(Invited(Invitation(invited, joining, old, snap.now + bound, bound, reason)))
                return True
            case _:
                assert_never(choice)

    def _follow_invitation(self, inv: Invitation, snap: Snapshot) -> bool:
        assert self.board is not None
        ready = self.board.ready_nodes()
        if all(ready.get(n) == inv.a.generation for n in inv.joining):
            self.board.watch_more(inv.joining)
            self._announce(inv.a, Resize.GROW, inv.old)
            return True
        if snap.now >= inv.deadline:
            nodes = ", ".join(inv.joining)
            why = f"the ranks of node {nodes} were not ready to join generation {inv.a.generation} within {inv.bound_s:g}s"
            self.give_up_grow(why, snap.now)
            return False
        return True

    def give_up_grow(self, why: str, now: float) -> None:
        """Give a grow up, if one is under way: the group goes on at its size; the newcomers' ranks time
        out joining, and their agent joins the rendezvous (the whole group then restarts with it)."""
        inv = self.state.invitation
        if inv is None:
            return
        board = self.board
        self.apply(GrowGivenUp(tuple((n, board.offer_seq(n)) for n in inv.joining) if board else ()))
        self.record("grow_in_place_failed", f"{why}: the group goes on at {inv.old} processes", now)

    def _announce(self, a: Announcement, kind: Resize, old: int) -> None:
        """Tell the other nodes (and nodes arriving later) the group's new nodes and size, and ask the
        local ranks to join in their places."""
        assert self.board is not None
        interrupted = self.interrupted()
        self.board.publish_group(a)
        self.board.announce(a)
        group, resized, since = (
            Group(a.active, a.world_size),
            Resized(kind, old, interrupted),
            self.clock.now(),
        )
        match kind:
            case Resize.SHRINK:
                self.apply(Shrunk(a.generation, group, resized, since))
            case Resize.GROW:
                self.apply(Grown(a.generation, group, resized, since))
            case _:
                assert_never(kind)
        self._request(a.generation, a)

    def _join(self, gen: int, seen: Announcement | None, reason: str, now: float) -> None:
        """Ask the local ranks to join generation ``gen``, in their new place when the group shrank or
        grew."""
        place = self._place(seen)
        group = Group(seen.active, seen.world_size) if seen is not None and place is not None else None
        self.apply(Joined(gen, group))
        self._request(gen, seen)
        self.record("joined_in_place", reason, now)

    def _place(self, a: Announcement | None) -> tuple[int, int] | None:
        if a is None or not a.world_size:  # the group did not resize: every rank keeps its place
            return None
        return a.place(self.node, self.cfg.nproc_per_node)

    def _request(self, gen: int, a: Announcement | None) -> None:

        assert isinstance(self.block, ControlBlock)
        self.block.request_reform(gen, self._place(a))

    def refuse(self, reason: str, now: float, tell: bool = True, record: bool = True) -> None:
        """Tell the local ranks no re-formation is coming (and, with ``tell``, the other nodes)."""

        self.apply(Refused())
        if isinstance(self.block, ControlBlock):
            self.block.refuse_reform()
        if tell and self.board is not None:
            self.board.refuse(reason)
        if record:
            self.record("in_place_skipped", reason, now)

    def interrupted(self) -> int:
        """The lowest step not completed by every local rank (the one a re-formation may interrupt)."""
        return min((q.last_done + 1 for q in self.tracker.progress.values()), default=0)

    def record(self, action: str, reason: str, now: float) -> None:
        self.ledger.emit(DecisionTaken(ts=now, action=action, reason=reason, **self.ledger.ctx()))
