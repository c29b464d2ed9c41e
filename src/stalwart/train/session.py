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

The hot path never blocks: per-step records go to the agent over a non-blocking datagram socket;
the stop request is read from a memory-mapped control block.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..chaos.once import claim
from ..chaos.plan import Fault, FaultPlan
from ..checkpoint.events import CheckpointPersistFailed
from ..events import (
    ChaosInjected,
    CheckpointLoaded,
    CheckpointRejected,
    Event,
    TrainingFinished,
    TrainingResumed,
)
from ..exit_codes import EXIT_PREEMPTED, EXIT_PREEMPTED_UNSAVED
from ..protocol import (
    DEFAULT_PG_TIMEOUT_S,
    PREFIX,
    CheckpointDone,
    Finished,
    Hello,
    LoopStarted,
    Message,
    Note,
    PhaseChanged,
    SectionBegan,
    SignalSeen,
    StepBegan,
    StepDone,
    WorkerEnv,
)
from ..protocol.control import ControlBlock
from ..protocol.error_record import write_error
from ..protocol.lifetime import die_with_parent
from ..protocol.pipe import Sender
from ..protocol.run_dir import RunDir


def _env_int(env: dict[str, str], *names: str, default: int) -> int:
    for n in names:
        if n in env and env[n] != "":
            return int(env[n])
    return default


class Session:
    """One training process's link to Stalwart. Works without an agent too (plain ``python``)."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        *,
        checkpoint_dir: str | None = None,
        keep_checkpoints: int = 3,
        tiers: tuple = (),
        memory_tier: bool = True,
    ) -> None:
        env = dict(os.environ if env is None else env)
        self.env = env
        self.rank = _env_int(env, "RANK", default=0)
        self.world_size = _env_int(env, "WORLD_SIZE", default=1)
        self.local_rank = _env_int(env, "LOCAL_RANK", default=0)
        wenv = WorkerEnv.from_env(env)
        self.worker_env = wenv
        self.attempt = _env_int(env, f"{PREFIX}ATTEMPT", "TORCHELASTIC_RESTART_COUNT", default=0)
        self.node = wenv.node if wenv else "local"
        self.run_id = wenv.run_id if wenv else ""
        self.run_dir = RunDir(Path(wenv.run_dir)) if wenv and wenv.run_dir else None
        self.under_agent = wenv is not None and wenv.ipc_fd >= 0
        self._ipc = Sender(wenv.ipc_fd) if wenv is not None and wenv.ipc_fd >= 0 else None
        self._control = ControlBlock(wenv.control, slot=self.local_rank) if wenv and wenv.control else None
        plan = FaultPlan.from_json(wenv.chaos) if wenv and wenv.chaos else FaultPlan()
        self._faults: tuple[Fault, ...] = plan.for_rank(self.rank)
        self._ledger = None
        self._ckpt_dir = checkpoint_dir or (str(self.run_dir.checkpoints) if self.run_dir else "checkpoints")
        self._keep = keep_checkpoints
        self._tiers = tuple(tiers)  # extra checkpoint tiers (stalwart.checkpoint.tiers.TierConfig)
        self._memory_tier = memory_tier  # under the agent: the node's memory tier, replicated to a peer
        self._emit_lock = threading.Lock()
        self._checkpointer = None
        self._step: int | None = None
        self._step_start = 0.0
        self._sections: dict[str, float] = {}
        self._signal: int | None = None
        self._completed = 0
        self._last_saved = -1
        self._durable_step = -1  # a step known to be on a durable tier: loaded from one, or committed
        self._loaded_step = -1  # the step this process resumed at (loaded, not saved by it)
        self._stack_file = None
        self._slow_pending = False
        self._slow_extra = 0.0
        self._base_step_s = 0.0
        self.pg_timeout_s = wenv.pg_timeout_s if wenv else DEFAULT_PG_TIMEOUT_S
        self._install_process_hooks()
        self._send(Hello(self.rank, time.time()))  # the agent's SDK timers apply to this worker from now on

    # --- process set-up --------------------------------------------------------------------

    def _install_process_hooks(self) -> None:
        if self.under_agent:
            # die with the agent: a worker orphaned by a killed agent must not keep a stale group alive
            die_with_parent()
            wenv = self.worker_env
            if wenv is not None and wenv.agent_pid and os.getppid() != wenv.agent_pid:
                os._exit(70)
        if self.run_dir is not None:
            self.run_dir.stacks.mkdir(parents=True, exist_ok=True)
            path = self.run_dir.stack_file(self.node, self.attempt, self.rank)
            self._stack_file = open(path, "w")  # noqa: SIM115 - kept open for faulthandler
            faulthandler.register(signal.SIGUSR2, file=self._stack_file, all_threads=True)
            previous = sys.excepthook

            def hook(etype, value, tb):  # record the exception for the agent's restart policy
                self._write_error(etype, value, tb)
                previous(etype, value, tb)

            sys.excepthook = hook
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signal = signum
        if self._ipc is not None:
            self._ipc.send(SignalSeen(self.rank, signum, time.time()))
        elif self._step is None and self._completed == 0:
            raise SystemExit(EXIT_PREEMPTED)

    def _write_error(self, etype: type, value: BaseException, tb: Any) -> None:
        if self.run_dir is None or etype in (SystemExit, KeyboardInterrupt):
            return
        path = self.run_dir.error_file(self.node, self.attempt, self.rank)
        write_error(path, etype, value, tb, step=self._step, rank=self.rank)

    def emit(self, ev: Event) -> None:
        """Write an event to this worker's own ledger file (not on the hot path)."""
        if self.run_dir is None:
            return
        if not ev.run_id and ev.attempt < 0:  # events from the checkpoint layer carry no context
            ev = dataclasses.replace(ev, **self._ctx())
        if isinstance(ev, CheckpointLoaded) and ev.tier == "peer":  # worth showing live: state from a peer
            self._send(
                Note(self.rank, f"checkpoint of step {ev.step} restored from a peer's copy", time.time())
            )
        if isinstance(ev, CheckpointRejected):  # worth showing live: a fallback to an older checkpoint
            self._send(Note(self.rank, f"checkpoint {Path(ev.path).name} rejected: {ev.reason}", time.time()))
        elif isinstance(ev, CheckpointPersistFailed):  # and a save that did not commit
            self._send(
                Note(
                    self.rank,
                    f"checkpoint of step {ev.step} not committed to {ev.tier}: {ev.reason}",
                    time.time(),
                )
            )
        with self._emit_lock:  # the checkpoint persist thread emits too
            if self._ledger is None:
                from ..ledger import LedgerWriter

                path = self.run_dir.worker_ledger(self.node, self.attempt, self.rank, os.getpid())
                self._ledger = LedgerWriter(path, writer=f"rank {self.rank}")
            self._ledger.append(ev)

    def _ctx(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "node": self.node, "attempt": self.attempt, "rank": self.rank}

    def init_process_group(self, backend: str = "gloo", **kwargs: Any) -> None:
        """``torch.distributed.init_process_group`` with the agent's validated timeout."""
        import torch.distributed as dist

        if self.world_size <= 1 and "MASTER_ADDR" not in self.env:
            return
        kwargs.setdefault("timeout", timedelta(seconds=self.pg_timeout_s))
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, **kwargs)

    @property
    def checkpointer(self):
        """The checkpoint engine (every rank): saves stall only for staging; the persist runs in the
        background; loads verify, fall back to older versions and reshard to this world size."""
        if self._checkpointer is None:
            from ..checkpoint.engine import CheckpointEngine
            from ..checkpoint.tiers import TierConfig
            from ..errors import CheckpointError

            if self._keep < 1:
                raise CheckpointError(
                    f"keep_checkpoints={self._keep} would delete every checkpoint", "use keep >= 1"
                )
            local = TierConfig(name="local", kind="local", location=str(self._ckpt_dir), keep=self._keep)
            tiers, link = [local, *self._tiers], None
            wenv = self.worker_env
            if self._memory_tier and wenv is not None and wenv.mem_dir:
                tiers, link = self._node_memory(tiers, wenv)
            self._checkpointer = CheckpointEngine(
                tiers,
                rank=self.rank,
                world_size=self.world_size,
                sink=self.emit,
                on_busy="wait",
                link=link,
            )
        return self._checkpointer

    def _node_memory(self, tiers: list, wenv: WorkerEnv) -> tuple[list, Any]:
        """The agent's node memory tier (newest version only) and this rank's link to the peers."""
        from ..checkpoint.node_tier import HELD, OWN, NodeLink
        from ..checkpoint.peer_store import PeerClient, parse_peers
        from ..checkpoint.tiers import TierConfig

        if any(t.kind == "memory" for t in tiers):  # the script configured its own memory tier
            return tiers, None
        mem = TierConfig(
            name="memory", kind="memory", location=str(Path(wenv.mem_dir) / OWN), keep=1, node_local=True
        )
        peers = parse_peers(wenv.peers) if wenv.peers else ()
        client = PeerClient(bytes.fromhex(wenv.peer_secret)) if peers and wenv.peer_secret else None
        link = NodeLink(
            local_rank=self.local_rank,
            local_world=_env_int(self.env, "LOCAL_WORLD_SIZE", default=self.world_size),
            node_index=_env_int(self.env, "GROUP_RANK", default=0),
            node=self.node,
            peers=peers,
            held=Path(wenv.mem_dir) / HELD,
            client=client,
        )
        return [*tiers, mem], link

    # --- resume and save --------------------------------------------------------------------

    def resume(self, state: dict[str, Any]) -> int:
        """Load the newest good checkpoint into ``state``; return the number of steps already done.
        Collective: models and optimizers load resharded to this world size (see train/state.py)."""
        from . import state as state_io

        targets = state_io.load_targets(state)
        found = self.checkpointer.load_latest(targets.tensors)
        if found is None:
            state_io.forget_init(targets.fresh)
            self._completed = 0
            if self.rank == 0:  # a fresh start is a resume from step 0: after a failure, all work was lost
                self.emit(TrainingResumed(ts=time.time(), step=0, from_checkpoint="", **self._ctx()))
            return 0
        own = found.rank_state_from == self.rank and found.world_size == self.world_size
        state_io.apply(state, targets, found.rank_state or {}, own_rng=own)
        self._completed = found.step
        self._last_saved = found.step
        self._loaded_step = found.step
        tiers = {t.name: t for t in self.checkpointer.tiers}
        if found.tier in tiers and tiers[found.tier].durable:
            self._durable_step = found.step  # resumed at the end: nothing new to make durable
        if self.rank == 0:
            self.emit(
                TrainingResumed(
                    ts=time.time(), step=found.step, from_checkpoint=str(found.path), **self._ctx()
                )
            )
        return found.step

    def save(self, state: dict[str, Any], *, emergency: bool = False) -> None:
        """Collective checkpoint of ``state`` after ``self.completed`` steps, on every rank: sharded
        tensors through DCP, plain per-rank extras (RNG, scheduler, data position) beside them.
        Returns once staged; whether the persist committed is :meth:`make_durable`'s business."""
        from . import state as state_io

        self._beat(self._completed, "checkpoint", time.time())
        cap = state_io.capture(state)
        self.checkpointer.save(self._completed, cap.sharded, cap.extras, force=True, emergency=emergency)
        self._last_saved = self._completed
        self._send(CheckpointDone(self.rank, self._completed, time.time()))

    def make_durable(self, state: dict[str, Any], *, emergency: bool, attempts: int = 3) -> str:
        """Collective: make the state after ``completed`` steps durable, saving it if it was not
        staged and re-saving with backoff (1 s, 2 s) while a persist fails (a full disk that frees
        up, a flaky mount). Returns "" once a durable tier committed it, else the last reason."""
        if self._durable_step == self._completed:
            return ""
        # loaded from a non-durable tier (node memory, a peer) at this step: nothing pending to wait for
        loaded_only = self._loaded_step == self._last_saved == self._completed
        why = ""
        for attempt in range(max(1, attempts)):
            if attempt:
                self._send(
                    Note(
                        self.rank,
                        f"checkpoint of step {self._completed} not committed ({why}); "
                        f"retrying ({attempt + 1}/{attempts})",
                        time.time(),
                    )
                )
                time.sleep(min(2.0, float(2 ** (attempt - 1))))
            if attempt or loaded_only or self._last_saved != self._completed:
                self.save(state, emergency=emergency)
            self._beat(self._completed, "checkpoint", time.time())  # waiting on the persist is not a hang
            res = self.checkpointer.wait()
            if (
                res is not None
                and res.step == self._completed
                and any(self.checkpointer.tier(name).durable for name in res.committed)
            ):
                self._durable_step = self._completed
                return ""
            if res is None:
                why = "nothing was persisted"
            else:
                why = "; ".join(f"{c.tier}: {c.reason}" for c in res.commits if not c.ok) or "no durable tier"
        return why

    @property
    def completed(self) -> int:
        return self._completed

    # --- the loop ---------------------------------------------------------------------------

    def loop(
        self, total_steps: int, state: dict[str, Any], *, checkpoint_every: int = 0, resume: bool = True
    ) -> Iterator[int]:
        """Yield step indices from the resume point to ``total_steps``; checkpoint every N steps."""
        start = self.resume(state) if resume else 0
        self._send(LoopStarted(self.rank, start, total_steps, time.time()))
        for step in range(start, total_steps):
            self._begin_step(step)
            yield step
            self._end_step(step)
            if checkpoint_every and self._completed % checkpoint_every == 0:
                self.save(state)
            if self._stop_requested():
                why = self.make_durable(state, emergency=True)
                self._send(CheckpointDone(self.rank, self._completed, time.time(), not why, why, "emergency"))
                self.finish(preempted=True)
                raise SystemExit(EXIT_PREEMPTED if not why else EXIT_PREEMPTED_UNSAVED)
        if checkpoint_every:
            why = self.make_durable(state, emergency=False)
            self._send(CheckpointDone(self.rank, self._completed, time.time(), not why, why, "final"))
        elif self._checkpointer is not None:
            self._checkpointer.wait()
        if self.rank == 0:
            self.emit(TrainingFinished(ts=time.time(), step=self._completed, **self._ctx()))

    def _stop_requested(self) -> bool:
        if self._control is not None:
            stop = self._control.stop_after()
            return 0 <= stop <= self._completed
        return self._signal is not None

    def _begin_step(self, step: int) -> None:
        self._step = step
        self._sections = {}
        self._step_start = time.time()
        self._beat(step, "", self._step_start)
        if self._faults:
            self._inject(step)

    def _end_step(self, step: int) -> None:
        end = time.time()
        unslowed = end - self._step_start - self._slow_extra
        self._base_step_s = unslowed if self._base_step_s == 0 else 0.8 * self._base_step_s + 0.2 * unslowed
        self._slow_extra = 0.0
        if self._ipc is not None:
            self._ipc.send(
                StepDone(self.rank, step, self._step_start, end - self._step_start, self._sections)
            )
        self._completed = step + 1
        self._step = None

    def section(self, name: str) -> _Section:
        """``with session.section("forward"): ...`` times a named part of the step."""
        return _Section(self, name)

    def phase(self, name: str, *, budget_s: float) -> _Phase:
        """``with session.phase("eval", budget_s=600): ...`` marks a long phase outside the steps
        (evaluation, a data-set rebuild): while it lasts the hang timeout is ``budget_s`` from its
        start, for this rank and for the ranks that wait for it in a collective."""
        if not name or budget_s <= 0:
            raise ValueError("a phase needs a name and a positive budget_s")
        return _Phase(self, name, float(budget_s))

    def _section_done(self, name: str, t0: float) -> None:
        self._sections[name] = self._sections.get(name, 0.0) + (time.time() - t0)
        if self._slow_pending:
            self._slow(name)

    def _beat(self, step: int, section: str, t: float) -> None:
        """Heartbeat: a store into this worker's shared-memory slot (a pipe message without an agent block)."""
        if self._control is not None and self._control.slot is not None:
            self._control.beat(t, step, section)
        elif section:
            self._send(SectionBegan(self.rank, step, section, t))
        else:
            self._send(StepBegan(self.rank, step, t))

    def _send(self, msg: Message) -> None:
        if self._ipc is not None:
            self._ipc.send(msg)

    def finish(self, *, preempted: bool = False) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()  # waits for background persists
            self._checkpointer = None
        self._send(Finished(self.rank, self._completed, preempted, time.time()))
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    # --- chaos --------------------------------------------------------------------------------

    def _inject(self, step: int) -> None:
        self._slow_pending = any(f.kind == "slow" for f in self._faults)
        chaos_dir = self.run_dir.chaos if self.run_dir else Path(".stalwart-chaos")
        for fault in self._faults:
            if fault.kind == "slow" or fault.step != step:
                continue
            if not claim(chaos_dir, fault):
                continue
            self.emit(
                ChaosInjected(
                    ts=time.time(), fault=fault.kind, step=step, detail=fault.describe(), **self._ctx()
                )
            )
            if fault.kind == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.kind == "exit":
                os._exit(1)
            elif fault.kind == "raise":
                raise RuntimeError(f"injected bug at step {step} (chaos: raise@rank={self.rank},step={step})")
            elif fault.kind == "hang":
                while True:
                    time.sleep(3600)

    def _slow(self, section: str) -> None:
        """A slowed rank spends (factor - 1) x its own unslowed step time extra in the step's first section."""
        self._slow_pending = False
        step = self._step if self._step is not None else -1
        for fault in self._faults:
            if (
                fault.kind == "slow"
                and step >= fault.start
                and (fault.stop is None or step <= fault.stop)
                and self._base_step_s > 0
            ):
                extra = (fault.factor - 1.0) * self._base_step_s
                time.sleep(extra)
                self._sections[section] += extra
                self._slow_extra += extra


class _Phase:
    __slots__ = ("_session", "_name", "_budget")

    def __init__(self, session: Session, name: str, budget_s: float) -> None:
        self._session = session
        self._name = name
        self._budget = budget_s

    def __enter__(self) -> None:
        s = self._session
        s._send(PhaseChanged(s.rank, self._name, self._budget, time.time()))

    def __exit__(self, *exc: object) -> None:
        s = self._session
        s._send(PhaseChanged(s.rank, "", 0.0, time.time()))


class _Section:
    """A section's context manager (a plain class: ``contextlib`` costs ~5 us per use)."""

    __slots__ = ("_session", "_name", "_t0")

    def __init__(self, session: Session, name: str) -> None:
        self._session = session
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> None:
        s = self._session
        self._t0 = time.time()
        s._beat(s._step if s._step is not None else s._completed, self._name, self._t0)

    def __exit__(self, *exc: object) -> None:
        self._session._section_done(self._name, self._t0)
