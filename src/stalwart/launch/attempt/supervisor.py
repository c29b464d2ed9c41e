"""The supervisor of one attempt: gather a snapshot, ask the monitors in a fixed order, apply.

Each tick it (1) collects: the workers' messages and heartbeats into the progress tracker, exit
codes, error records of the ranks that failed, CPU samples of workers without the SDK, the signal the
agent received, the nodes waiting to join; (2) freezes them into a :class:`Snapshot`; (3) asks
:func:`decide` for the decisions of the monitors (:mod:`stalwart.launch.attempt.monitors`) in priority order;
(4) carries them out (stop the group, capture stacks, ask ranks to stop after a step) and writes the
ledger. Time comes from the injected clock, and every action goes through the ports of
launch/ports.py (ledger, console, failure files, the job around the attempt, chaos), so a test or the
simulator drives the whole loop with the fakes of launch/fakes.py and no process.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

from typing_extensions import assert_never

from ...diagnose.cross_layer import COMM_CODES
from ...diagnose.kill_witness import KillWitness
from ...diagnose.precision import GateDecision
from ...diagnose.signals import from_failure
from ...events import FailureDetected, StackCaptured, StepCompleted, TimeoutsCalibrated, WorkersStopped
from ...health.link_counters import LinkSampler
from ...policy.world_size import WorldPlan
from ...protocol import CorruptionFound, LoopStarted, Note
from ..clock import Clock
from ..cpu_progress import CpuProgress, ProcSample, read_proc
from ..decision import AttemptOutcome, Decision, DecisionKind
from ..inplace.board_records import Board
from ..inplace.recovery import InPlaceRecovery
from ..ports import (
    AttemptChaos,
    Console,
    ControlWrites,
    FailureFiles,
    Inbox,
    JobLink,
    LedgerSink,
    WorkerProcesses,
)
from ..processes.worker_group import WorkerSpec, describe_exit, ending_note, tail
from ..progress import ProgressTracker
from ..rendezvous.store_watch import StoreUnreachable
from ..snapshot import Snapshot, cpu_marks, frozen, views
from .hang_stopper import HangStopper
from .monitors import (
    HangMonitor,
    StragglerMonitor,
    SupervisorSettings,
    crash,
    decide,
    default_monitors,
)
from .sdc_quarantine import SdcQuarantine
from .straggler_records import record_stragglers

MEMBERSHIP_EVERY_S = 1.0  # how often the rendezvous is asked for nodes waiting to join
STRAGGLER_EVERY = 10  # steps between two straggler checks


class Supervisor:
    def __init__(
        self,
        *,
        cfg: SupervisorSettings,
        ledger: LedgerSink,
        console: Console,
        files: FailureFiles,
        job: JobLink,
        chaos: AttemptChaos,
        group: WorkerProcesses,
        receiver: Inbox,
        block: ControlWrites,
        specs: Sequence[WorkerSpec],
        clock: Clock,
        attempt: int,
        node: str,
        monitors: Sequence[Callable[[Snapshot], Decision | None]] | None = None,
        world: WorldPlan | None = None,
        straggler_gate: GateDecision | None = None,
        read_proc: Callable[[int], ProcSample | None] = read_proc,
        board: Board | None = None,
        link: LinkSampler | None = None,
        prior_step_times: Sequence[float] = (),  # an earlier attempt's at the same world size
    ) -> None:
        self.world = world
        self.cfg = cfg
        self.ledger, self.console, self.files, self.job, self.chaos = ledger, console, files, job, chaos
        self.read_proc = read_proc
        self.group = group
        self.receiver = receiver
        self.block = block
        self.specs = list(specs)
        self.clock = clock
        self.attempt = attempt
        self.node = node
        self.monitors = (
            tuple(monitors) if monitors is not None else default_monitors(cfg, straggler_gate=straggler_gate)
        )
        self.hangs = next((m for m in self.monitors if isinstance(m, HangMonitor)), None)
        strag = next((m for m in self.monitors if isinstance(m, StragglerMonitor)), StragglerMonitor())
        ranks = [s.global_rank for s in self.specs]
        self.tracker = ProgressTracker(ranks=ranks, started=clock.now())
        self.tracker.step_times.extend(prior_step_times)  # a restart's hang timeout is calibrated at once
        self.window: deque[StepCompleted] = deque(maxlen=strag.steps_kept * max(1, len(ranks)))
        self.stragglers: dict[int, float] = {}
        self.slow_links: set[int] = set()  # ranks whose silence was raised as a slow link
        self.last_straggler_check = -1
        self.last_membership_check = self.tracker.started
        self.store_unreachable = ""  # why the rendezvous store counts as gone (the store monitor acts)
        self.stop_requested_at: float | None = None
        self.calibrated_reported = False
        self.cpu: dict[int, CpuProgress] = {}
        self.in_place = InPlaceRecovery(
            cfg=cfg,
            ledger=ledger,
            group=group,
            receiver=receiver,
            block=block,
            tracker=self.tracker,
            num_nodes=len(world.active) if world is not None else 1,
            attempt=attempt,
            clock=clock,
            specs={s.global_rank: s for s in self.specs},
            board=board,
            node=node,
            world_size=world.world_size if world is not None else 0,
            active=world.active if world is not None else (),
            spares=bool(world is not None and world.spares),
        )
        # why a rank died by a signal (the chaos plan, when it sent it)
        self.witness = KillWitness((group.pid(r) for r in ranks), injected_by=files.injected_by)
        self.link = link  # this host's link counters, for the slow-link check (None: not read)
        sizes = (strag.min_nodes, strag.max_nodes, strag.rule)
        self.sdc = SdcQuarantine(node, job, ledger, console, clock, group, world, sizes)
        self.hangs_stop = HangStopper(self)

    # --- collect ---------------------------------------------------------------------------------

    def gather(self) -> Snapshot:
        straggler_step = self._collect_messages(self.clock.now())
        self.chaos.tick(self.tracker)
        codes = self.group.poll()
        now = self.clock.now()  # after the poll: an exit is never later than the tick that saw it
        codes = self._raised_and_stuck(codes, now)
        failed = {r: c for r, c in codes.items() if c not in (None, 0)}
        logs = {s.global_rank: s.log_path for s in self.specs}
        errors = (
            {r: self.files.error_of(r, logs.get(r)) for r in failed}
            if failed and self.stop_requested_at is None
            else {}
        )
        self._sample_cpu(codes, now)
        snap = self._snapshot(now, codes, errors, self._nodes_waiting(now), straggler_step)
        kills = frozen(self.witness.observe(self.group.pid, codes, logs, now))
        return dataclasses.replace(snap, kills=kills, link=self.link.sample(now) if self.link else ())

    def _collect_messages(self, now: float) -> int:
        """The workers' messages and heartbeats into the tracker, step records into the ledger; the
        step at which to check for stragglers this tick, or -1."""
        tracker, batch = self.tracker, []
        for msg in self.receiver.drain():
            if isinstance(msg, Note):
                self.console.note(msg.text)
            elif isinstance(msg, LoopStarted) and msg.rank == 0 and msg.first_step > 0:
                gen = self.in_place.generation
                origin = (
                    f"the live state, in place (generation {gen})" if gen else "the newest good checkpoint"
                )
                self.console.note(f"workers resumed at step {msg.first_step} from {origin}")
            elif isinstance(msg, CorruptionFound):
                self.sdc.seen(msg)  # this node quarantined when the finding names it with confidence
            rec = tracker.observe(msg, now)
            if rec is not None:
                batch.append(
                    StepCompleted(
                        ts=rec.start + rec.duration,
                        rank=rec.rank,
                        step=rec.step,
                        start=rec.start,
                        duration=rec.duration,
                        sections=rec.sections,
                        **self.ledger.ctx(),
                    )
                )
        for spec in self.specs:
            beat = self.block.read_beat(spec.local_rank)
            if beat is not None:
                tracker.observe_beat(spec.global_rank, beat[0], beat[1], beat[2], now)
        if not batch:
            return -1
        straggler_step = -1
        self.ledger.record(batch)
        top = max(batch, key=lambda e: e.step)
        self.window.extend(batch)
        if top.step // STRAGGLER_EVERY != self.last_straggler_check // STRAGGLER_EVERY:
            self.last_straggler_check = straggler_step = top.step
        self.console.stepped(self.attempt, [(e.rank, e.start, e.ts) for e in batch], len(self.specs))
        # the batch's newest step end, not this tick: a recovery's time is the one the report gives
        self.console.progress(
            top.step + 1, tracker.total_steps, self.attempt, tracker.rate(), now=max(e.ts for e in batch)
        )
        return straggler_step

    def _raised_and_stuck(self, codes: dict[int, int | None], now: float) -> dict[int, int | None]:
        """A rank that recorded its exception but cannot exit (e.g. a persist thread blocked in a
        collective with a lost peer keeps the interpreter alive) is a crash once the stop grace has
        passed: never left to the (checkpoint-phase) hang timeout."""
        if self.stop_requested_at is not None:
            return codes
        late = max(2.0, self.cfg.workers.stop_grace_s)
        for r, t in self.files.raised_since().items():
            if codes.get(r, 0) is None and now - t >= late:
                codes = {**codes, r: 1}
        return codes

    def _sample_cpu(self, codes: dict[int, int | None], now: float) -> None:
        """CPU samples of the workers without the SDK (their progress is their CPU time)."""
        if self.tracker.sdk_ranks() or self.stop_requested_at is not None:
            return
        for spec in self.specs:
            sample = self.read_proc(self.group.pid(spec.global_rank))
            if sample is not None and codes.get(spec.global_rank) is None:
                self.cpu.setdefault(spec.global_rank, CpuProgress(since=now)).observe(sample, now)

    def _nodes_waiting(self, now: float) -> int | None:
        """Nodes waiting to join, asked at most every MEMBERSHIP_EVERY_S; None when not asked. The
        answer is a background reader's latest (launch/rendezvous/store_watch.py): nothing here waits on the
        network; a store silent over its timeout is kept in ``store_unreachable`` for the monitors."""
        if self.stop_requested_at is not None or now - self.last_membership_check <= MEMBERSHIP_EVERY_S:
            return None
        self.last_membership_check = now
        try:
            return self.job.nodes_waiting()
        except StoreUnreachable as exc:
            self.store_unreachable = str(exc)
            return 0
        except Exception:  # noqa: BLE001 - the store may be briefly unreachable
            return 0

    def _snapshot(self, now, codes, errors, waiting, straggler_step) -> Snapshot:
        tr = self.tracker
        return Snapshot(
            now=now,
            tick=self.cfg.monitor_interval_s,
            node=self.node,
            started=tr.started,
            ranks=views(tr),
            codes=frozen(codes),
            exit_times=frozen(self.group.exit_times),
            errors=frozen(errors),
            step_times=tuple(tr.step_times),
            max_done_step=tr.max_done_step,
            preempted_ranks=frozenset(tr.preempted_ranks),
            durability=frozen(tr.durability),
            signal=self.job.signal(),
            stop_requested_at=self.stop_requested_at,
            nodes_waiting=waiting,
            store_unreachable=self.store_unreachable,
            cpu=cpu_marks(self.cpu),
            recent_steps=tuple(self.window) if straggler_step >= 0 else (),
            straggler_step=straggler_step,
            stragglers=frozen(self.stragglers),
            slow_links=frozenset(self.slow_links),
            attempt=self.attempt,
            world=self.world,
            hosts=self.job.hosted_stores(),
            total_steps=tr.total_steps,
        )

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> AttemptOutcome:
        """Supervise until the attempt ends; its outcome, with the failures it recovered in place."""
        out = self._run()
        return dataclasses.replace(out, in_place=self.in_place.completed) if self.in_place.completed else out

    def _run(self) -> AttemptOutcome:
        while True:
            snap = self.gather()
            busy = self.stop_requested_at is not None or self.in_place.reforming
            fell_back = self.in_place.tick(snap) or self.sdc.leave(busy)  # left: it corrupted a replica
            if fell_back is not None:
                return fell_back
            self._calibration(snap)
            decisions = decide(snap, self.monitors)
            for d in decisions:
                outcome = self.apply(d, snap)
                if outcome is not None:
                    return outcome
            if decisions and decisions[-1].kind in (DecisionKind.HOLD, DecisionKind.FORWARD_SIGNAL):
                self.clock.sleep(snap.tick)
                continue
            deadline = self.hangs.next_check(snap) if self.hangs is not None else snap.now + snap.tick
            self.clock.sleep(max(0.001, min(snap.tick, deadline - self.clock.now())))

    def _calibration(self, snap: Snapshot) -> None:
        """Record once that the hang timeout is calibrated from measured step times."""
        if self.calibrated_reported or self.hangs is None or not snap.sdk_ranks:
            return
        if snap.stop_requested_at is not None:
            return
        ht, _ = self.hangs.timeout(snap)
        if ht.calibrated:
            self.calibrated_reported = True
            self.ledger.emit(
                TimeoutsCalibrated(
                    ts=snap.now,
                    hang_timeout_s=ht.seconds,
                    p99_step_s=ht.p99_s,
                    samples=ht.samples,
                    reason=ht.reason,
                    **self.ledger.ctx(),
                ),
                show=False,
            )

    # --- act -------------------------------------------------------------------------------------

    def apply(self, d: Decision, snap: Snapshot) -> AttemptOutcome | None:
        """Carry out one decision; the attempt's outcome when it ends the attempt, else None."""
        grace = self.cfg.workers.stop_grace_s
        match d.kind:
            case DecisionKind.STRAGGLERS:
                self._stragglers(d, snap)
            case DecisionKind.EXCLUDE_STRAGGLER:
                return self._exclude(d, snap)
            case DecisionKind.REQUEST_STOP:
                self.stop_requested_at = snap.now
                self.block.request_stop(d.stop_step)
            case DecisionKind.FORWARD_SIGNAL:  # no Session: the signal goes to the workers, as torchrun
                self.stop_requested_at = snap.now
                self.group.signal(snap.signal) if snap.signal is not None else None
            case DecisionKind.HOLD | DecisionKind.STOPPED_EXIT:
                pass
            case DecisionKind.CRASH:
                return self._crash(d, snap)
            case DecisionKind.HANG:
                if self.in_place.reforming:
                    return None  # the ranks re-form: the re-formation's own bound applies
                return self._hang_or_raised(d, snap)
            case DecisionKind.FINISHED:
                self.job.release_spares()
            case DecisionKind.INTERRUPT | DecisionKind.PASS_STOP | DecisionKind.DEADLINE:
                self.group.stop(grace)
            case DecisionKind.MEMBERSHIP:
                self.group.stop(grace)
                self.ledger.emit(WorkersStopped(ts=self.clock.now(), reason=d.reason, **self.ledger.ctx()))
            case _:
                assert_never(d.kind)
        return d.outcome

    def _hang_or_raised(self, d: Decision, snap: Snapshot) -> AttemptOutcome | None:
        # a worker slow to exit after raising (on a loaded machine) is an exception, not a hang
        raised = self.files.raised_not_exited()
        if not raised:
            return self._hang(d, snap)
        logs = {s.global_rank: s.log_path for s in self.specs}
        errors = {r: self.files.error_of(r, logs.get(r)) for r in raised}
        again = dataclasses.replace(
            snap, now=self.clock.now(), errors=frozen(errors), exit_times=frozen(self.group.exit_times)
        )
        return self._crash(crash(again, raised), again)

    def _stragglers(self, d: Decision, snap: Snapshot) -> None:
        step = snap.straggler_step if snap.straggler_step >= 0 else snap.max_done_step + 1  # a slow link
        record_stragglers(self.ledger, self.clock.now(), self.stragglers, d, step, self.slow_links)

    def _exclude(self, d: Decision, snap: Snapshot) -> AttemptOutcome:
        """This node is the straggler to exclude: record it, quarantine the node, stop the workers at
        once (the job goes on without them: nothing to save here) and leave; the other agents see
        their peers go and re-form at the next valid world size, or with a hot spare."""
        assert d.outcome is not None and d.incident is not None
        self._stragglers(d, snap)
        ctx = self.ledger.ctx()
        try:
            state = self.job.quarantine(self.node, d.reason)
        except Exception as exc:  # noqa: BLE001 - the node still leaves this job; say why it is not recorded
            state = f"not recorded in the node state ({type(exc).__name__}: {exc})"
        self.console.note(
            f"excluding this node ({self.node}) as a straggler: {d.reason}; node state: {state}"
        )
        self.group.stop(0.0)
        inc = dataclasses.replace(d.incident, evidence=d.incident.evidence + (f"node state: {state}",))
        self.ledger.emit(inc.to_event(ctx["run_id"], ctx["node"], ctx["attempt"]), show=False)
        self.ledger.emit(
            WorkersStopped(
                ts=self.clock.now(), reason=f"straggler rank {d.rank}: node {self.node} excluded", **ctx
            ),
            show=False,
        )
        return d.outcome

    def _crash(self, d: Decision, snap: Snapshot) -> AttemptOutcome | None:
        assert d.outcome is not None and d.outcome.failure is not None
        failure, root, err = d.outcome.failure, d.rank, d.error
        spec = next((s for s in self.specs if s.global_rank == root), None)
        text = tail(spec.log_path if spec else None, 3)
        # one line names the failure (the FailureDetected below); before it, where the rank's log is
        # and, unless the rank printed it on the console already, how its output ended
        if ending := ending_note(spec):
            self.console.note(ending)
        ctx = self.ledger.ctx()
        detected = FailureDetected(
            ts=d.outcome.detected_at,
            failure=failure.kind,
            evidence=failure.evidence,
            onset=d.onset,
            step=failure.step,
            rank=root,
            exit_code=d.exit_code,
            signal=describe_exit(d.exit_code) if d.exit_code < 0 else "",
            error_type=err.type if err else "",
            error_message=err.message[:500] if err else "",
            **ctx,
        )
        self.ledger.emit(detected)
        in_place = self.in_place.consider(d, snap, self.clock.now())
        if not in_place:  # the group is broken: no save to wait for, only the survivors' live state left
            self.group.stop(self.cfg.workers.stop_grace_s if self.tracker.leaves_state(root) else 0.0)
        if text and failure.kind != "crash":
            self.ledger.emit(
                StackCaptured(
                    ts=self.clock.now(),
                    rank=root,
                    stack=err.traceback if err else text,
                    reason="traceback of the failed rank",
                    **ctx,
                ),
                show=False,
            )
        self._incident(d, detected)
        if in_place:
            return None
        self.ledger.emit(
            WorkersStopped(ts=self.clock.now(), reason=f"rank {root} {failure.evidence}", **ctx), show=False
        )
        return d.outcome

    def _hang(self, d: Decision, snap: Snapshot) -> AttemptOutcome | None:
        return self.hangs_stop.hang(d, snap)

    def _incident(self, d: Decision, detected: FailureDetected) -> None:
        """The decision's incident, unless the live diagnosis owns this failure: a communication
        failure or a hang is a symptom it joins with the node's evidence into the one incident that
        names the cause (diagnose/live.py), so the agent does not raise a second, symptom-level one."""
        if d.incident is None:
            return
        named_elsewhere = self.node not in d.incident.blast_radius.nodes  # a host that left (monitors.crash)
        if (
            getattr(self.cfg.diagnosis, "interval_s", 0)
            and from_failure(detected).code in COMM_CODES
            and not named_elsewhere
        ):
            return
        ctx = self.ledger.ctx()
        self.ledger.emit(d.incident.to_event(ctx["run_id"], ctx["node"], ctx["attempt"]), show=False)
