"""The in-process SDK: a few lines in a training loop give timings, heartbeats, exact resume and
emergency checkpoints.

    session = Session()
    session.init_process_group("gloo")
    state = {"model": model, "optimizer": opt, "scheduler": sched, "data": sampler}
    for step in session.loop(total_steps, state, checkpoint_every=50):
        with session.section("data"): batch = ...
        with session.section("forward"): loss = ...
        with session.section("backward"): loss.backward()
        with session.section("optimizer"): opt.step()
    session.finish()

``loop`` resumes from the newest good checkpoint (model, optimizer, LR schedule, any object with
``state_dict``/``load_state_dict``, and every RNG), owns the step boundaries, checkpoints between
steps (so checkpoint stall is never counted as step time), and stops with an emergency checkpoint
when the agent asks (SIGTERM/SIGUSR1 on the agent, or a scheduler preemption notice).
The hot path never blocks: per-step records go to the agent over a non-blocking pipe; the stop
request is read from a memory-mapped control block.
``Session`` is a facade over small parts: the :class:`~stalwart.train.worker_link.WorkerLink` (the
pipe and control block to the agent), the :class:`~stalwart.train.process_guard.ProcessGuard` (signal
handlers, excepthook, faulthandler, parent-death signal: :meth:`Session.close` or ``with Session()
as s:`` restores exactly what it installed), the :class:`~stalwart.train.checkpoints.Checkpoints`, and
optional :class:`~stalwart.train.step_hooks.StepHook`s (chaos is one, loaded only when the agent
passed a fault plan). Time comes from an injected :class:`~stalwart.train.clock.Clock`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ..events import Event, TrainingResumed
from ..exit_codes import EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED
from ..ledger import LedgerWriter
from ..protocol import (
    CHECKPOINT_SECTION,
    DEFAULT_PG_TIMEOUT_S,
    CheckpointDone,
    DurableKind,
    Finished,
    Hello,
    LoopStarted,
    Message,
    Note,
    SignalSeen,
    StepDone,
    WorkerEnv,
    WorkerPlace,
)
from ..protocol.error_record import write_error
from ..protocol.run_dir import RunDir
from ..protocol.step_history import claim_steps
from .checkpoints import Checkpoints
from .clock import SYSTEM_CLOCK, Clock
from .inplace import Generation
from .process_guard import ProcessGuard
from .session_scopes import Phase, Section, live_note
from .step_hooks import StepHook
from .worker_link import WorkerLink

if TYPE_CHECKING:
    from ..checkpoint.engine import CheckpointEngine
    from ..checkpoint.tiers import TierConfig
    from ..ledger import LedgerWriter
    from .anomaly_watch import AnomalyWatch
    from .left_state import LeftState
    from .own_loop import Tracked
    from .reform import Reformer
    from .replica_check import ReplicaCheck

T = TypeVar("T")


class Session:
    """One training process's link to Stalwart. Works without an agent too (plain ``python``)."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        *,
        checkpoint_dir: str | None = None,
        keep_checkpoints: int = 3,
        tiers: tuple[TierConfig, ...] = (),
        memory_tier: bool = True,
        clock: Clock | None = None,
        hooks: Sequence[StepHook] = (),
    ) -> None:
        self.env = env = dict(os.environ if env is None else env)
        self._place = place = WorkerPlace.from_env(env)
        self.rank, self.world_size, self.local_rank = place.rank, place.world_size, place.local_rank
        self.worker_env = wenv = WorkerEnv.from_env(env)
        self.attempt = place.attempt
        self.node = wenv.node if wenv else "local"
        self.run_id = wenv.run_id if wenv else ""
        self.run_dir = RunDir(Path(wenv.run_dir)) if wenv and wenv.run_dir else None
        self.pg_timeout_s = wenv.pg_timeout_s if wenv else DEFAULT_PG_TIMEOUT_S
        self._clock = clock or SYSTEM_CLOCK
        self._now = self._clock.now
        self._link = WorkerLink(wenv, rank=self.rank, local_rank=self.local_rank)
        self.under_agent = self._link.connected
        self._ckpt = Checkpoints(
            place=place,
            node=self.node,
            worker_env=wenv,
            directory=checkpoint_dir or (str(self.run_dir.checkpoints) if self.run_dir else "checkpoints"),
            keep=keep_checkpoints,
            tiers=tuple(tiers),
            memory_tier=memory_tier,
            sink=self.emit,
        )
        self._ledger: LedgerWriter | None = None
        self._emit_lock = threading.Lock()
        self._step: int | None = None
        self._step_start = 0.0
        self._sections: dict[str, float] = {}
        self._signal: int | None = None
        self._completed = 0
        self._hooks: tuple[StepHook, ...] = (*hooks, *self._chaos(wenv))
        self._reform: Reformer | None = None  # in-place recovery, when the script runs under run()
        self._replicas: ReplicaCheck | None = None  # silent-data-corruption checks, from the first loop
        self._left: LeftState | None = None  # the loop idiom's state left on the way out (left_state.py)
        self._anomalies: AnomalyWatch | None = None  # loss and gradient-norm checks, from the first observe
        self._guard = self._process_guard(wenv)
        self._guard.install()
        self._send(Hello(self.rank, self._now()))  # the agent's SDK timers apply to this worker from now on
        claim_steps()  # its own steps count: the bootstrap's locator, chaos and SDC check stand down

    # --- parts --------------------------------------------------------------------------------

    def _chaos(self, wenv: WorkerEnv | None) -> tuple[StepHook, ...]:
        """This rank's faults from the agent's fault plan, if there is one (else chaos is never imported)."""
        if wenv is None or not wenv.chaos:
            return ()
        from .chaos_hook import ChaosHook  # deferred: no plan, no stalwart.chaos

        hook = ChaosHook.from_plan(
            wenv.chaos,
            rank=self.rank,
            chaos_dir=self.run_dir.chaos if self.run_dir else Path(".stalwart-chaos"),
            emit=self.emit,
            context=self._ctx(),
            clock=self._clock,
        )
        return (hook,) if hook is not None else ()

    def _process_guard(self, wenv: WorkerEnv | None) -> ProcessGuard:
        run_dir = self.run_dir
        return ProcessGuard(
            on_signal=self._on_signal,
            on_error=self._write_error if run_dir is not None else None,
            stack_file=run_dir.stack_file(self.node, self.attempt, self.rank)
            if run_dir is not None
            else None,
            # die with the agent: a worker orphaned by a killed agent must not keep a stale group alive
            agent_pid=wenv.agent_pid if wenv is not None and self.under_agent else None,
        )

    @property
    def clock(self) -> Clock:
        return self._clock

    def run(self, train: Callable[[Session], T]) -> T:
        """Run the training function ``train(session)`` with in-place recovery: when a peer fails, this
        process stays alive, leaves the broken process group, joins the re-formed one with the
        replacement ranks and calls ``train`` again; its ``init_process_group`` joins the new group,
        its model and DDP/FSDP wrappers are built anew on it, and its ``loop`` continues from the live
        state of the last completed step (taken from a replica, not from a checkpoint). ``train``
        is the one hook: whatever it builds on the process group is rebuilt by running it again.
        Without an agent, or for a failure that is not a peer's, it is a plain call."""
        from .reform import Reformer, rng_dir  # deferred: heavy (torch)

        wenv = self.worker_env
        if self._reform is None and wenv is not None and self.under_agent and wenv.reform_timeout_s > 0:
            gen = Generation(wenv.generation, self._link.reform, self._clock.sleep, self._now)
            self._reform = Reformer(
                self,
                gen,
                wenv.reform_timeout_s,
                rng_dir(wenv.mem_dir, self.run_dir.root if self.run_dir else None),
            )
            self._reform.t_rejoin = self._now()
            self._reform.joining = wenv.generation > 0  # a replacement, started in the generation it joins
            self._reform.take_place()  # a replacement started after the group shrank in place
            self._send(Hello(self.rank, self._now(), in_place=True))
        if self._reform is None:
            return train(self)
        return self._reform.run(train)

    def close(self) -> None:
        """Undo what this session did to the process: restore the signal handlers, excepthook,
        faulthandler and parent-death signal it installed, wait for checkpoint persists and close
        its files and its end of the agent link. It does not tell the agent that training finished
        (that is :meth:`finish`). ``with Session() as session:`` calls it on leaving."""
        self._ckpt.close()
        self._close_ledger()
        self._guard.close()
        self._link.close()
        for part in (self._reform, self._left):
            if part is not None:
                part.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, etype: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _on_signal(self, signum: int) -> None:
        self._signal = signum
        if self._link.connected:
            self._send(SignalSeen(self.rank, signum, self._now()))
        elif self._step is None and self._completed == 0:
            raise SystemExit(EXIT_PREEMPTED)

    def _reclaim_signals(self) -> None:
        self._guard.reclaim_signals()

    def _write_error(
        self, etype: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        """Record an uncaught exception for the agent's restart policy."""
        if self.run_dir is None or etype in (SystemExit, KeyboardInterrupt):
            return
        path = self.run_dir.error_file(self.node, self.attempt, self._link.rank)  # as launched, shrunk or not
        write_error(path, etype, value, tb, step=self._step, rank=self._link.rank, ts=self._now())
        if self._left is not None and (why := self._left.on_error(value, self._completed)):
            self._send(Note(self.rank, why, self._now()))

    # --- events -------------------------------------------------------------------------------

    def emit(self, ev: Event) -> None:
        """Write an event to this worker's own ledger file (not on the hot path)."""
        if self.run_dir is None:
            return
        if not ev.run_id and ev.attempt < 0:  # events from the checkpoint layer carry no context
            ev = dataclasses.replace(ev, **self._ctx())
        note = live_note(ev)
        if note:
            self._send(Note(self.rank, note, self._now()))
        with self._emit_lock:  # the checkpoint persist thread emits too
            if self._ledger is None:
                path = self.run_dir.worker_ledger(self.node, self.attempt, self.rank, os.getpid())
                self._ledger = LedgerWriter(path, writer=f"rank {self.rank}")
            self._ledger.append(ev)

    def _close_ledger(self) -> None:
        with self._emit_lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None

    def _ctx(self) -> dict[str, Any]:  # Any: JSON event context
        return {"run_id": self.run_id, "node": self.node, "attempt": self.attempt, "rank": self.rank}

    def init_process_group(self, backend: str = "gloo", **kwargs: Any) -> None:  # Any: torch's kwargs
        """``torch.distributed.init_process_group`` with the agent's validated timeout."""
        import torch.distributed as dist  # deferred: heavy (torch)

        if self.world_size <= 1 and not self._place.has_master:
            return
        kwargs.setdefault("timeout", timedelta(seconds=self.pg_timeout_s))
        if self._reform is not None and self._reform.generation.current > 0:
            self._reform.init_group(backend, self.rank, self.world_size, **kwargs)
            return
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, **kwargs)

    # --- resume and save --------------------------------------------------------------------

    @property
    def checkpointer(self) -> CheckpointEngine:
        """The checkpoint engine (every rank): saves stall only for staging; the persist runs in the
        background; loads verify, fall back to older versions and reshard to this world size."""
        return self._ckpt.engine

    def resume(self, state: dict[str, Any], *, max_step: int | None = None) -> int:  # Any: user state
        """Load the newest good checkpoint (of a step no later than ``max_step``, if given) into
        ``state``; return the number of steps already done. Collective: models and optimizers load
        resharded to this world size (see train/state.py)."""
        found = self._ckpt.resume(state, max_step)
        self._completed = found.step if found is not None else 0
        if self.rank == 0:  # a fresh start is a resume from step 0: after a failure, all work was lost
            origin = str(found.path) if found is not None else ""
            self.emit(
                TrainingResumed(ts=self._now(), step=self._completed, from_checkpoint=origin, **self._ctx())
            )
        return self._completed

    def save(self, state: dict[str, Any], *, emergency: bool = False) -> None:  # Any: user state
        """Collective checkpoint of ``state`` after ``self.completed`` steps, on every rank: sharded
        tensors through DCP, plain per-rank extras (RNG, scheduler, data position) beside them.
        Returns once staged; whether the persist committed is :meth:`make_durable`'s business."""
        self._link.beat(self._completed, CHECKPOINT_SECTION, self._now())
        self._ckpt.save(state, self._completed, emergency=emergency)
        self._send(CheckpointDone(self.rank, self._completed, self._now()))

    def make_durable(  # Any: user state (torch objects)
        self, state: dict[str, Any], *, emergency: bool, attempts: int = 3
    ) -> str:
        """Collective: make the state after ``completed`` steps durable, saving it if it was not
        staged and re-saving with backoff (1 s, 2 s) while a persist fails (a full disk that frees
        up, a flaky mount). Returns "" once a durable tier committed it, else the last reason."""
        ck, done = self._ckpt, self._completed
        if ck.durable_step == done:
            return ""
        # loaded from a non-durable tier (node memory, a peer) at this step: nothing pending to wait for
        loaded_only = ck.loaded_step == ck.last_saved == done
        why = ""
        for attempt in range(max(1, attempts)):
            if attempt:
                text = f"checkpoint of step {done} not committed ({why}); retrying ({attempt + 1}/{attempts})"
                self._send(Note(self.rank, text, self._now()))
                self._clock.sleep(min(2.0, float(2 ** (attempt - 1))))
            if attempt or loaded_only or ck.last_saved != done:
                self.save(state, emergency=emergency)
            self._link.beat(done, CHECKPOINT_SECTION, self._now())  # waiting on the persist is not a hang
            why = ck.wait_durable(done)
            if not why:
                return ""
        return why

    @property
    def completed(self) -> int:
        return self._completed

    # --- the loop ---------------------------------------------------------------------------

    def loop(
        self,
        total_steps: int,
        state: dict[str, Any],  # Any: user state (torch objects)
        *,
        checkpoint_every: int | str = 0,
        resume: bool = True,
    ) -> Iterator[int]:
        """Yield step indices from the resume point to ``total_steps``; checkpoint every N steps, or
        at the interval that follows the run with ``checkpoint_every="auto"`` (checkpoint/auto_every.py)."""
        from .cadence import between_steps, bind_hooks, cadence_for, end_training  # deferred: heavy (torch)
        from .left_state import arm  # deferred: heavy (torch)
        from .replica_check import loop_check  # deferred: heavy (torch)

        self._left = arm(self, state)  # the loop idiom's live state (train/left_state.py)
        start = self._start(state, resume)
        cadence = cadence_for(self, checkpoint_every)
        replicas = loop_check(self, state, start)  # silent data corruption (docs/sdc.md)
        bind_hooks(self, state)
        self._send(
            LoopStarted(self.rank, start, total_steps, self._now(), leaves_state=self._left is not None)
        )
        step = start
        while step < total_steps:
            self._begin_step(step)
            yield step
            self._end_step(step)
            if cadence.saves:  # every rank just met in the step's collectives: the engine's group forms now
                self._ckpt.prepare()
            done = self._completed
            saving = cadence.due(done)
            if replicas is not None and replicas.due(done, saving or done == total_steps):
                back = replicas.verify(done, saving)  # silent data corruption: raises if it must stop
                if back >= 0:  # every rank goes back to the newest checkpoint verified clean
                    step = self.resume(state, max_step=back)
                    continue
            between_steps(self, state, cadence, saving)
            step = self._completed
        end_training(self, state, checkpoint_every)

    def track(  # Any: user state (torch objects)
        self,
        state: dict[str, Any],
        *,
        total_steps: int = 0,
        checkpoint_every: int | str = 0,
        resume: bool = True,
    ) -> Tracked:
        """For a script that keeps its own loop: ``with session.track(state) as steps:`` resumes
        (``steps.start``: the steps already done); ``steps.done()`` ends each step and does there what
        ``loop`` does between steps. ``total_steps``: for progress, 0 when not known. See
        train/own_loop.py."""
        from .own_loop import Tracked  # deferred: heavy (torch)

        return Tracked(
            self,
            state,
            total_steps=total_steps,
            checkpoint_every=checkpoint_every,
            resume=resume,
        )

    def _start(self, state: dict[str, Any], resume: bool) -> int:  # Any: user state (torch objects)
        """The step the loop starts at: the re-formed group's live state (in-place recovery), else the
        newest good checkpoint (or 0 when ``resume`` is off)."""
        if self._reform is not None:
            step = self._reform.start(state, resume)
            if step is not None:
                return step
        elif self._left is not None and resume and (step := self._left.resume(self, state)) is not None:
            return step
        return self.resume(state) if resume else 0

    def _stop(self, state: dict[str, Any]) -> None:  # Any: user state (torch objects)
        """Asked to stop: make this step durable, finish, and exit with a code that says whether it saved."""
        why = self.make_durable(state, emergency=True)
        self._send(
            CheckpointDone(self.rank, self._completed, self._now(), not why, why, DurableKind.EMERGENCY)
        )
        self.finish(preempted=True)
        raise SystemExit(EXIT_PREEMPTED if not why else EXIT_PREEMPTED_UNSAVED)

    def _stop_requested(self) -> bool:
        stop = self._link.stop_after()
        if stop is not None:
            return 0 <= stop <= self._completed
        return self._signal is not None

    def _begin_step(self, step: int) -> None:
        self._step = step
        self._sections = {}
        self._step_start = t = self._now()
        self._link.beat(step, "", t)
        if self._reform is not None:
            self._reform.step_began(step)
        if self._left is not None:
            self._left.step_began(step)
        for hook in self._hooks:
            hook.step_began(step)

    def _end_step(self, step: int) -> None:
        seconds = self._now() - self._step_start
        for hook in self._hooks:
            hook.step_ended(step, seconds)
        if self._link.connected:
            self._link.send(StepDone(self.rank, step, self._step_start, seconds, self._sections))
        self._completed = step + 1
        self._step = None
        if self._left is not None:
            self._left.step_ended()

    def observe(self, loss: object, *, grad_norm: object = None, scaler: object = None) -> None:
        """This step's loss (a number or tensor), gradient norm and AMP ``GradScaler``, once per step
        after the optimizer step: a NaN/Inf or a spike is recorded, never acted on (docs/sdc.md)."""
        if self._anomalies is None:
            from .anomaly_watch import AnomalyWatch  # deferred: only for scripts that report a loss

            self._anomalies = AnomalyWatch.of_worker(self.rank, self.emit, self._send, self._ctx, self._clock)
        step = self._step if self._step is not None else self._completed - 1
        self._anomalies.observe(step, loss, grad_norm, scaler)

    def section(self, name: str) -> Section:
        """``with session.section("forward"): ...`` times a named part of the step."""
        return Section(self, name)

    def phase(self, name: str, *, budget_s: float) -> Phase:
        """``with session.phase("eval", budget_s=600): ...`` marks a long phase outside the steps
        (evaluation, a data-set rebuild): while it lasts the hang timeout is ``budget_s`` from its
        start, for this rank and for the ranks that wait for it in a collective."""
        if not name or budget_s <= 0:
            raise ValueError("a phase needs a name and a positive budget_s")
        return Phase(self, name, float(budget_s))

    def _section_done(self, name: str, t0: float) -> None:
        self._sections[name] = self._sections.get(name, 0.0) + (self._now() - t0)
        if self._hooks:
            step = self._step if self._step is not None else -1
            for hook in self._hooks:
                spent = hook.section_ended(step, name)
                if spent:
                    self._sections[name] += spent

    def _beat(self, step: int, section: str, t: float) -> None:
        """Heartbeat: a store into this worker's shared-memory slot (a pipe message without one)."""
        self._link.beat(step, section, t)

    def _send(self, msg: Message) -> None:
        self._link.send(msg)

    def finish(self, *, preempted: bool = False) -> None:
        """Wait for checkpoint persists, tell the agent this worker finished, close the ledger.
        The process hooks stay until :meth:`close` (or process exit): an exception or a hang after
        ``finish`` is still recorded."""
        self._ckpt.close()  # waits for background persists
        if self._replicas is not None:  # a replay that stopped short of its step says so (docs/sdc.md)
            self._replicas.end(self._completed)
        self._send(Finished(self.rank, self._completed, preempted, self._now()))
        self._close_ledger()
