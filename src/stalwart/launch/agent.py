"""The node agent behind ``stalwart run``: rendezvous, spawn, supervise, decide, restart.

One agent per node. Agents meet through torch.distributed.elastic's c10d rendezvous (as torchrun
does). Each rendezvous round gets a fresh master port for the workers' own TCPStore, so restarted
workers never see stale keys from an earlier round (the shared-store hang of torch >= 2.5).

Collect -> decide -> act: the monitor loop collects exit codes and worker messages, the pure
policies in ``timeouts``, ``progress`` and ``restart_policy`` decide, and this module acts
(stack capture, stop, restart, verdict) and writes every step of it to the ledger.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..chaos.once import claim
from ..chaos.plan import FaultPlan, build_plan
from ..diagnose.root_cause import ErrorRecord, classify, error_from_log, read_elastic_error, read_error
from ..diagnose.straggler import score_ranks
from ..errors import ConfigError, LedgerFullError
from ..events import (
    AttemptEnded,
    AttemptStarted,
    ChaosInjected,
    DecisionTaken,
    Event,
    FailureDetected,
    JobEnded,
    JobStarted,
    StackCaptured,
    StepCompleted,
    StragglerCleared,
    StragglerDetected,
    TimeoutsCalibrated,
    WorkersStarted,
    WorkersStopped,
)
from ..exit_codes import (
    EXIT_INFRA,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_UNSAVED,
    REQUEUE_HELPS,
)
from ..ledger import LedgerWriter
from ..protocol import LoopStarted, Note, WorkerEnv, elastic_env
from ..run_dir import RunDir
from ..train import control
from . import chaos_actions
from .config import CONFIG_SETTINGS, RunConfig
from .cpu_progress import CpuProgress, detect_cpu_stall, read_proc
from .output import routes
from .progress import ProgressTracker, detect_hang, durability_problem
from .restart_policy import Failure, decide
from .timeouts import hang_timeout
from .warm import WarmPool, choose_path
from .workers import WorkerGroup, WorkerSpec, describe_exit, tail, tail_lines
from .world_size import plan_world

# workers that ran this long without announcing the SDK do not use it: a stop signal is passed on to
# them at once (before that, they may still be importing, and the stop waits for the SDK's checkpoint)
NO_SDK_AFTER_S = 30.0
STRAGGLER_WINDOW = 20  # steps per rank scored together
STRAGGLER_THRESHOLD = 1.2  # own-work time over the fleet median that marks a straggler


@dataclass(frozen=True)
class AttemptOutcome:
    status: (
        str  # succeeded | final_unsaved | failed | membership | preempted | preempted_unsaved | interrupted
    )
    failure: Failure | None = None
    detected_at: float = 0.0
    detail: str = ""  # why a save the verdict depends on did not commit
    step: int = -1  # the step the emergency or final save was for


class Agent:
    def __init__(
        self,
        cfg: RunConfig,
        *,
        notify: Callable[[Event], None] | None = None,
        progress: Callable[[int, int, int, float], None] | None = None,
        started: float | None = None,
        note: Callable[[str], None] | None = None,
    ):
        self.cfg = cfg
        self.run = RunDir(cfg.run_dir).create()
        self.started = started or time.time()
        self.run.archive_errors(cfg.node_name, f"{int(self.started)}-{os.getpid()}")
        self.plan: FaultPlan = build_plan(cfg.chaos, cfg.chaos_file or None)
        self._notify = notify or (lambda ev: None)
        self._progress = progress or (lambda step, total, attempt, rate: None)
        self._note = note or (lambda text: None)
        self.ledger = LedgerWriter(
            self.run.agent_ledger(cfg.node_name, os.getpid()), writer=f"agent {cfg.node_name}"
        )
        self._worker_store = None  # the TCPStore this agent hosts for this attempt's workers
        self._unwritten: list[Event] = []  # events the ledger could not take yet (full disk)
        self._ledger_full = False
        self._dropped = 0
        self.attempt = 0
        self.history: list[Failure] = []
        self._signal: int | None = None
        self._group_rank = 0
        self._rdzv = None
        self._round_store = None
        self._spares_waiting = False

    # --- ledger ------------------------------------------------------------------------------

    def _ctx(self) -> dict:
        return {"run_id": self.cfg.run_id, "node": self.cfg.node_name, "attempt": self.attempt}

    def emit(self, ev: Event, *, show: bool = True) -> None:
        self.record((ev,))
        if show:
            self._notify(ev)

    def record(self, evs) -> None:
        """Append to the ledger; a full disk never stops the job: events wait in memory (bounded)
        and are written once there is room again, and the console says so once."""
        self._unwritten.extend(evs)
        try:
            self.ledger.extend(self._unwritten)
        except LedgerFullError as exc:
            if not self._ledger_full:
                self._note(f"ledger not written ({exc}); keeping events in memory and retrying")
            self._ledger_full = True
            if len(self._unwritten) > 200_000:  # step records go first; decisions and verdicts stay
                keep = [e for e in self._unwritten if not isinstance(e, StepCompleted)]
                self._dropped += len(self._unwritten) - len(keep)
                self._unwritten = keep[-200_000:]
            return
        self._unwritten = []
        if self._ledger_full:
            self._ledger_full = False
            self._note("ledger writable again; the events kept in memory are written")

    # --- main --------------------------------------------------------------------------------

    def run_job(self) -> int:
        cfg = self.cfg
        self.emit(
            JobStarted(
                ts=self.started,
                script=cfg.script,
                args=tuple(cfg.script_args),
                nproc_per_node=cfg.nproc_per_node,
                min_nodes=cfg.min_nodes,
                max_nodes=cfg.max_nodes,
                max_restarts=cfg.max_restarts,
                config=cfg.model_dump(mode="json"),
                **self._ctx(),
            )
        )
        handled = {signal.SIGTERM, signal.SIGUSR1, signal.SIGINT}
        handled |= {getattr(signal, n.strip()) for n in cfg.signals_to_handle.split(",") if n.strip()}
        handled -= {signal.SIGKILL, signal.SIGSTOP, signal.SIGUSR2, signal.SIGCHLD}
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        self._warm: WarmPool | None = None
        if cfg.warm and not cfg.no_python:
            self._warm = WarmPool(
                python=cfg.python,
                script=cfg.script,
                module=cfg.module,
                script_args=list(cfg.script_args),
                env=WorkerEnv.strip(os.environ, CONFIG_SETTINGS),
                cwd=os.getcwd(),
                label=f"stalwart-fork-server run_dir={self.run.root}",
            )
            self._warm.launch()  # its imports overlap with the rendezvous
        try:
            return self._loop()
        except BaseException as exc:
            # an agent bug or an unexpected stop still leaves a verdict in the ledger
            self._end("agent_error", f"agent error: {type(exc).__name__}: {exc}", EXIT_INFRA)
            raise
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            if self._rdzv is not None:
                try:
                    self._rdzv.shutdown()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            self._close_worker_store()
            if self._warm is not None:
                self._warm.close()
            self.ledger.close()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signal = signum

    def _end(self, outcome: str, verdict: str, code: int) -> int:
        self.emit(
            JobEnded(
                ts=time.time(),
                verdict=verdict,
                outcome=outcome,
                exit_code=code,
                requeue_helps=REQUEUE_HELPS.get(code, False),
                **self._ctx(),
            )
        )
        if self._unwritten or self._dropped:
            self._note(
                f"the ledger is missing {len(self._unwritten) + self._dropped} event(s), this verdict "
                f"included: {self.run.ledger} stayed full; the report will not show them"
            )
        return code

    def _newest_good(self) -> int | None:
        """The newest checkpoint step in the run directory that verifies, or None."""
        from ..checkpoint.manifest import verify
        from ..checkpoint.store import FileStore

        try:
            for step, path in FileStore(self.run.checkpoints).versions():
                if verify(path)[0] is not None:
                    return step
        except Exception:  # noqa: BLE001 - a verdict must not fail on an unreadable checkpoint tree
            return None
        return None

    def _newest_text(self) -> str:
        newest = self._newest_good()
        return (
            f"newest good checkpoint: step {newest}" if newest is not None else "no good checkpoint on disk"
        )

    def _gate(self) -> str:
        """Health gate before a start; returns "" if this node may run, else the reason it may not."""
        cfg = self.cfg
        if not cfg.health_gate:
            return ""
        from .node_gate import check_node

        res = check_node(
            node=cfg.node_name,
            now=time.time(),
            state_dir=cfg.health_state_dir,
            fixture=cfg.health_fixture,
            active=cfg.health_active and self.attempt > 0,
            backend=cfg.health_backend,
        )
        if res.passed:
            return ""
        self.emit(
            DecisionTaken(
                ts=time.time(),
                action="exclude_node",
                reason=f"exclude node {cfg.node_name}: {res.reason} (node state {res.state})",
                **self._ctx(),
            )
        )
        return res.reason

    def _loop(self) -> int:
        while True:
            unhealthy = self._gate()
            if unhealthy:
                return self._end(
                    "node_unhealthy",
                    f"node {self.cfg.node_name} excluded by the health gate: "
                    f"{unhealthy}; the other nodes continue without it",
                    EXIT_INFRA,
                )
            try:
                group_rank, names, addr, port, store = self._rendezvous()
            except Exception as exc:  # noqa: BLE001 - any rendezvous failure ends the job with a verdict
                return self._end(
                    "rendezvous_failed",
                    f"rendezvous failed: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}",
                    EXIT_INFRA,
                )
            if self._signal is not None:
                return self._end(
                    "interrupted",
                    f"stopped by {signal.Signals(self._signal).name} before start",
                    EXIT_INTERRUPTED if self._signal == signal.SIGINT else EXIT_PREEMPTED,
                )
            plan = plan_world(names, self.cfg.nproc_per_node, 1, self.cfg.max_nodes, self.cfg.size_rule)
            if not plan.runnable or len(plan.active) < self.cfg.min_nodes:
                return self._end("rendezvous_failed", plan.reason, EXIT_INFRA)
            if self.cfg.node_name in plan.spares:
                outcome = self._stand_by(plan, store)
                if outcome.status == "succeeded":
                    return self._end(
                        "succeeded", "the job finished while this node stood by as a hot spare", EXIT_OK
                    )
                if outcome.status != "membership":
                    return self._end("aborted", f"hot spare stopped: {outcome.status}", EXIT_INFRA)
                self.attempt += 1
                continue
            if (
                len(names) > 1
                and self.cfg.node_name == plan.active[0]
                and (plan.spares or len(names) != len(plan.active))
            ):
                self.emit(
                    DecisionTaken(ts=time.time(), action="plan_world", reason=plan.reason, **self._ctx())
                )
            self._spares_waiting = bool(plan.spares)
            self._round_store = store
            outcome = self._run_attempt(plan.active.index(self.cfg.node_name), len(plan.active), addr, port)
            if outcome.status == "succeeded":
                return self._end(
                    "succeeded",
                    f"training finished after {self.attempt + 1} attempt(s), "
                    f"{len(self.history)} failure(s) recovered",
                    EXIT_OK,
                )
            if outcome.status == "stopped":
                return self._end(
                    "preempted",
                    f"preempted by {signal.Signals(self._signal or signal.SIGTERM).name}: workers stopped (no SDK, "
                    "no emergency checkpoint); requeue to resume from the script's own checkpoints",
                    EXIT_PREEMPTED,
                )
            if outcome.status == "preempted":
                newest = self._newest_good()
                if outcome.step >= 0 and newest is not None and newest != outcome.step:
                    return self._end(
                        "preempted_unsaved",
                        f"preempted, but the emergency checkpoint of step {outcome.step} does not verify on "
                        f"disk; {self._newest_text()}; a requeue resumes from there",
                        EXIT_INFRA,
                    )
                at = f" of step {outcome.step}" if outcome.step >= 0 else ""
                return self._end(
                    "preempted",
                    f"preempted: emergency checkpoint{at} committed; requeue to resume",
                    EXIT_PREEMPTED,
                )
            if outcome.status == "preempted_unsaved":
                return self._end(
                    "preempted_unsaved",
                    f"preempted, but the emergency checkpoint was NOT committed ({outcome.detail}); "
                    f"{self._newest_text()}; a requeue resumes from there",
                    EXIT_INFRA,
                )
            if outcome.status == "final_unsaved":
                return self._end(
                    "final_unsaved",
                    f"training finished, but its final state (step {outcome.step}) was NOT committed "
                    f"({outcome.detail}); {self._newest_text()}; a requeue resumes from there",
                    EXIT_INFRA,
                )
            if outcome.status == "interrupted":
                return self._end("aborted", "interrupted by the operator", EXIT_INTERRUPTED)
            if outcome.status == "membership":
                self.emit(
                    DecisionTaken(
                        ts=time.time(),
                        action="restart",
                        reason="restart: a node is waiting to join; re-forming the group",
                        **self._ctx(),
                    )
                )
                self.attempt += 1
                continue
            failure = outcome.failure
            assert failure is not None
            self.history.append(failure)
            d = decide(self.history, self.cfg.budget)
            self.emit(
                DecisionTaken(
                    ts=time.time(),
                    action=d.action,
                    reason=d.reason,
                    restarts_used=d.infra_used,
                    restarts_allowed=self.cfg.max_restarts,
                    backoff_s=d.backoff_s,
                    **self._ctx(),
                )
            )
            if d.action == "stop":
                return self._end(d.outcome, d.reason, d.exit_code)
            if d.backoff_s:
                time.sleep(d.backoff_s)
            self.attempt += 1

    # --- rendezvous --------------------------------------------------------------------------

    def _rendezvous(self) -> tuple[int, list[str], str, int, object]:
        """Return (group_rank, node names by group rank, master addr, master port, round store)."""
        cfg = self.cfg
        self._close_worker_store()  # a fresh store every attempt (torch >= 2.5 hangs on a reused one)
        if not cfg.use_c10d:
            addr = cfg.master_addr or "127.0.0.1"
            port = cfg.master_port
            if cfg.max_nodes == 1 or cfg.node_rank == 0:
                port = self._host_worker_store(addr, port)
            if cfg.max_nodes == 1:
                return 0, [cfg.node_name], addr, port, None
            # static node ranks (torchrun's --node-rank/--master-addr/--master-port)
            names = [cfg.node_name if i == cfg.node_rank else f"node-rank-{i}" for i in range(cfg.max_nodes)]
            return cfg.node_rank, names, addr, port, None
        if self._rdzv is None:
            self._rdzv = self._make_handler()
        info = self._rdzv.next_rendezvous()
        store, group_rank, num_nodes = info.store, info.rank, info.world_size
        store.set(f"stalwart/name/{group_rank}", cfg.node_name)
        if group_rank == 0:
            addr = cfg.local_addr or _local_addr(cfg.rdzv_endpoint)
            port = self._host_worker_store(addr, 0)
            store.set("stalwart/master", f"{addr}:{port}")
        master = store.get("stalwart/master").decode()
        addr, _, port = master.rpartition(":")
        names = [store.get(f"stalwart/name/{i}").decode() for i in range(num_nodes)]
        if len(set(names)) != len(names):
            raise RuntimeError(
                f"two agents use the same node name ({', '.join(names)}); give each --node-name"
            )
        self._group_rank = group_rank
        return group_rank, names, addr, int(port), store

    def _host_worker_store(self, addr: str, port: int) -> int:
        """Host this attempt's store for the workers (torchrun's agent store): a socket bound to
        ``addr`` only (loopback for one node) and held from bind to close, so no other process can
        take the port in between, and no worker listens on every interface. Returns the port."""
        import datetime

        from torch.distributed import TCPStore

        host = "127.0.0.1" if addr in ("", "localhost") else addr
        try:
            sock = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=1024
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} for the workers' store: {exc.strerror}",
                "free the port or choose another --master-port/--local-addr",
            ) from None
        port = sock.getsockname()[1]
        fd = sock.detach()  # the store's server owns the listening socket from here and closes it
        try:
            store = TCPStore(
                host,
                port,
                None,
                True,
                timeout=datetime.timedelta(seconds=self.cfg.pg_timeout_s),
                wait_for_workers=False,
                master_listen_fd=fd,
            )
        except Exception:
            os.close(fd)
            raise
        self._worker_store = store
        return port

    def _close_worker_store(self) -> None:
        self._worker_store = None  # the last reference: the server stops and closes its socket

    def _stand_by(self, plan, store) -> AttemptOutcome:
        """A hot spare: no workers; re-join when the active nodes re-form, leave when the job is done."""
        self.emit(
            DecisionTaken(ts=time.time(), action="standby", reason=f"hot spare: {plan.reason}", **self._ctx())
        )
        while True:
            if self._signal is not None:
                return AttemptOutcome("interrupted")
            try:
                if store.check(["stalwart/done"]):
                    return AttemptOutcome("succeeded")
                if self._rdzv.num_nodes_waiting() > 0:
                    return AttemptOutcome("membership")
            except Exception:  # noqa: BLE001 - the store went away with the job
                return AttemptOutcome("store_lost")
            time.sleep(0.5)

    def _make_handler(self):
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        cfg = self.cfg
        conf = {
            "join_timeout": cfg.rdzv_timeout_s,
            "last_call_timeout": cfg.rdzv_last_call_s,
            "close_timeout": 10,
            "keep_alive_interval": max(1, int(cfg.rdzv_keepalive_s)),
            "keep_alive_max_attempt": 3,
        }
        if cfg.rdzv_host is not None:
            conf["is_host"] = cfg.rdzv_host
        params = RendezvousParameters(
            backend="c10d",
            endpoint=cfg.rdzv_endpoint,
            run_id=cfg.rdzv_id,
            min_nodes=cfg.min_nodes,
            max_nodes=cfg.max_nodes,
            local_addr=cfg.local_addr or None,
            **conf,
        )
        return get_rendezvous_handler(params)

    # --- one attempt -------------------------------------------------------------------------

    def _worker_specs(
        self, group_rank: int, num_nodes: int, addr: str, port: int, receiver, ctl: Path
    ) -> list[WorkerSpec]:
        cfg = self.cfg
        world = num_nodes * cfg.nproc_per_node
        inherited = WorkerEnv.strip(os.environ, CONFIG_SETTINGS)
        log_dir = cfg.log_dir / cfg.run_id / f"attempt_{self.attempt}" if cfg.log_dir is not None else None
        run_logs = [
            self.run.log_file(cfg.node_name, self.attempt, group_rank * cfg.nproc_per_node + local)
            for local in range(cfg.nproc_per_node)
        ]
        out_routes = routes(
            nproc=cfg.nproc_per_node,
            redirects=cfg.redirects,
            tee=cfg.tee,
            ranks_filter=cfg.local_ranks_filter,
            log_dir=log_dir,
            run_log=run_logs,
        )
        specs = []
        for local in range(cfg.nproc_per_node):
            rank = group_rank * cfg.nproc_per_node + local
            fd = receiver.new_channel()
            env = dict(inherited)
            env.update(
                elastic_env(
                    rank=rank,
                    local_rank=0 if cfg.virtual_local_rank else local,
                    world=world,
                    local_world=cfg.nproc_per_node,
                    group_rank=group_rank,
                    group_world=num_nodes,
                    role=cfg.role,
                    master_addr=addr,
                    master_port=port,
                    restart_count=self.attempt,
                    max_restarts=cfg.max_restarts,
                    run_id=cfg.rdzv_id,
                    error_file=str(self.run.elastic_error_file(cfg.node_name, self.attempt, rank)),
                    use_agent_store=True,  # an agent hosts the store; workers only connect to it
                )
            )
            env.update(
                WorkerEnv(
                    run_dir=str(self.run.root),
                    run_id=cfg.run_id,
                    node=cfg.node_name,
                    attempt=self.attempt,
                    ipc_fd=fd,
                    control=str(ctl),
                    agent_pid=os.getpid(),
                    pg_timeout_s=cfg.pg_timeout_s,
                    chaos=self.plan.to_json(),
                ).to_env()
            )
            if cfg.virtual_local_rank and "CUDA_VISIBLE_DEVICES" not in os.environ:
                env["CUDA_VISIBLE_DEVICES"] = str(local)
            env["PYTHONUNBUFFERED"] = "1"
            env.setdefault("OMP_NUM_THREADS", "1")
            specs.append(
                WorkerSpec(
                    local, rank, env, run_logs[local], ipc_fd=fd, route=out_routes[local], role=cfg.role
                )
            )
        return specs

    def _argv(self) -> list[str]:
        cfg = self.cfg
        if cfg.run_path:
            head = [
                cfg.python,
                "-u",
                "-c",
                "import runpy, sys; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')",
                cfg.script,
            ]
        elif cfg.no_python:
            head = [cfg.script]
        elif cfg.module:
            head = [cfg.python, "-u", "-m", cfg.script]
        else:
            head = [cfg.python, "-u", cfg.script]
        return head + list(cfg.script_args)

    def _run_attempt(self, group_rank: int, num_nodes: int, addr: str, port: int) -> AttemptOutcome:
        from ..train.ipc import Receiver

        cfg = self.cfg
        self._group_rank = group_rank
        world = num_nodes * cfg.nproc_per_node
        self.emit(
            AttemptStarted(
                ts=time.time(),
                world_size=world,
                group_rank=group_rank,
                num_nodes=num_nodes,
                master=f"{addr}:{port}",
                **self._ctx(),
            )
        )
        ctl = self.run.control_file(cfg.node_name, os.getpid(), self.attempt)
        control.create(ctl, slots=cfg.nproc_per_node)
        block = control.ControlBlock(ctl, writable=True)
        receiver = Receiver()
        specs = self._worker_specs(group_rank, num_nodes, addr, port, receiver, ctl)
        warm, path_reason, forced = self._warm_path()
        group = WorkerGroup(self._argv(), specs, warm=warm)
        try:
            pids = group.start()
            for spec in specs:  # the workers hold their write ends now
                os.close(spec.ipc_fd)
            self._path_taken(group, path_reason, forced)
            self.emit(
                WorkersStarted(
                    ts=time.time(),
                    pids=tuple(pids),
                    global_ranks=tuple(s.global_rank for s in specs),
                    **self._ctx(),
                ),
                show=False,
            )
            outcome = self._supervise(group, receiver, block, specs)
        finally:
            receiver.close()
            block.close()
            group.close()
        self.emit(AttemptEnded(ts=time.time(), reason=outcome.status, **self._ctx()), show=False)
        return outcome

    def _warm_path(self) -> tuple[WarmPool | None, str, bool]:
        """Offer the fork server to this attempt's start, or say why it starts cold. A server that died
        or imported modules since edited is replaced here, before the start, not in the background:
        its imports would compete for the CPU with the cold workers of the attempt that found it dead."""
        cfg, pool = self.cfg, self._warm
        forced = cfg.warm_fail_attempt == self.attempt
        if pool is None:
            choice = choose_path(enabled=cfg.warm, python_program=not cfg.no_python, server_state="none")
            return None, choice.reason, False
        changed = () if forced else pool.changed()
        replaced = ""
        if not forced and (changed or pool.state().startswith("dead")):
            replaced = ", ".join(changed) + " changed" if changed else pool.state()[5:].strip()
            pool.launch()
        state = pool.state()
        if state == "ready" and not forced:
            why = pool.ready()  # bounded wait for the imports of a server still starting
            state = f"dead: {why}" if why else state
        if forced:
            pool.force_failure()
        choice = choose_path(enabled=True, python_program=True, server_state=state, forced_failure=forced)
        reason = f"{choice.reason}; new fork server (previous: {replaced})" if replaced else choice.reason
        return (pool if choice.warm else None), reason, forced

    def _path_taken(self, group: WorkerGroup, reason: str, forced: bool) -> None:
        """Write how the workers started (warm, or cold and why) to the ledger."""
        if group.path == "warm":
            why = reason
        elif group.cold_reason and group.cold_reason != "warm start not offered":
            why = f"warm start failed ({group.cold_reason}); started cold" + (
                " (forced by chaos)" if forced else ""
            )
        else:
            why = reason
        action = "start_warm" if group.path == "warm" else "start_cold"
        self.emit(DecisionTaken(ts=time.time(), action=action, reason=f"{group.path}: {why}", **self._ctx()))

    def _supervise(self, group: WorkerGroup, receiver, block, specs: list[WorkerSpec]) -> AttemptOutcome:
        cfg = self.cfg
        ranks = [s.global_rank for s in specs]
        now = time.time()
        tracker = ProgressTracker(ranks=ranks, started=now)
        calibrated_reported = False
        window_steps: deque[StepCompleted] = deque(maxlen=STRAGGLER_WINDOW * len(ranks))
        stragglers: dict[int, float] = {}
        last_straggler_check = -1
        last_membership_check = now
        stop_requested_at: float | None = None
        tick = cfg.monitor_interval_s
        cpu: dict[int, CpuProgress] = {}
        while True:
            now = time.time()
            batch = []
            for msg in receiver.drain():
                if isinstance(msg, Note):
                    self._note(msg.text)
                elif isinstance(msg, LoopStarted) and msg.rank == 0 and msg.first_step > 0:
                    self._note(f"workers resumed at step {msg.first_step} from the newest good checkpoint")
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
                            **self._ctx(),
                        )
                    )
            for spec in specs:
                beat = block.read_beat(spec.local_rank)
                if beat is not None:
                    tracker.observe_beat(spec.global_rank, beat[0], beat[1], beat[2], now)
            if batch:
                self.record(batch)
                top = max(batch, key=lambda e: e.step)
                window_steps.extend(batch)
                if top.step // 10 != last_straggler_check // 10:
                    last_straggler_check = top.step
                    self._check_stragglers(window_steps, stragglers, top.step)
                recent = list(tracker.step_times)[-20:]
                rate = len(recent) / max(sum(recent), 1e-9) if recent else 0.0
                self._progress(top.step + 1, tracker.total_steps, self.attempt, rate / max(1, len(ranks)))
            self._agent_chaos(tracker)

            # 1. exits
            codes = group.poll()
            failed = {r: c for r, c in codes.items() if c not in (None, 0)}
            if failed and stop_requested_at is None:
                return self._fail_crash(group, failed, tracker, specs)
            if all(c is not None for c in codes.values()):
                if stop_requested_at is not None or tracker.preempted_ranks:
                    # exit 76 only for an emergency checkpoint every rank saw commit to a durable tier
                    why = durability_problem(tracker, "emergency")
                    step = max(
                        (d.step for d in tracker.durability.values() if d.kind == "emergency"), default=-1
                    )
                    if not why and step < 0:  # exit 76 needs a rank's word that it committed
                        why = "no rank reported a committed emergency checkpoint"
                    if not why and all(c in (0, EXIT_PREEMPTED) for c in codes.values()):
                        return AttemptOutcome("preempted", step=step)
                    if stop_requested_at is not None or EXIT_PREEMPTED_UNSAVED in codes.values():
                        why = why or "workers exited " + ", ".join(
                            describe_exit(c) for c in set(codes.values())
                        )
                        return AttemptOutcome("preempted_unsaved", detail=why, step=step)
                    return AttemptOutcome("failed")
                self._release_spares()
                why = durability_problem(tracker, "final")
                if why:  # the training finished but its final state is not safe: say so, never "succeeded"
                    return AttemptOutcome("final_unsaved", detail=why, step=tracker.max_done_step + 1)
                return AttemptOutcome("succeeded")

            # 2. signals to the agent: coordinated emergency checkpoint
            if self._signal is not None and stop_requested_at is None:
                if self._signal == signal.SIGINT:
                    group.stop(cfg.stop_grace_s)
                    return AttemptOutcome("interrupted")
                stop_requested_at = now
                # every rank stops after the same step: two ahead of the most advanced one, or, before any
                # step was seen, after its first step (workers only record signals; the agent coordinates)
                block.request_stop(tracker.max_step_in_progress() + 2 if tracker.steps_seen() else 0)
            if stop_requested_at is not None:
                if not tracker.sdk_ranks() and now - tracker.started >= NO_SDK_AFTER_S:
                    # a script without the SDK: nothing to coordinate, pass the stop on as torchrun does
                    group.stop(cfg.stop_grace_s)
                    return AttemptOutcome("stopped")
                if now - stop_requested_at > cfg.emergency_deadline_s:
                    group.stop(cfg.stop_grace_s)
                    saved = [d for d in tracker.durability.values() if d.kind == "emergency" and d.durable]
                    if saved and len(saved) == len(specs):  # every rank had committed; only the exit lagged
                        return AttemptOutcome("preempted", step=max(d.step for d in saved))
                    return AttemptOutcome(
                        "preempted_unsaved",
                        detail=f"not every rank finished it within --emergency-deadline {cfg.emergency_deadline_s:g}s",
                    )
                time.sleep(tick)
                continue

            # 3. hangs: heartbeats of workers that use the SDK; CPU progress of every worker otherwise
            sdk = tracker.sdk_ranks()
            hang_deadline = now + tick
            if not sdk:
                for spec in specs:
                    sample = read_proc(group.pid(spec.global_rank))
                    if sample is not None and codes.get(spec.global_rank) is None:
                        cpu.setdefault(spec.global_rank, CpuProgress(since=now)).observe(sample, now)
                stall = detect_cpu_stall(cpu, now + tick, cfg.cpu_stall_s)
                if stall is not None:
                    if raised := self._raised_not_exited(group, specs):  # an exception still exiting
                        return self._fail_crash(group, raised, tracker, specs)
                    return self._fail_hang(
                        group, stall, tracker, "no SDK in the script: hang detection by CPU progress", step=-1
                    )
            else:
                phase = (
                    "start-up"
                    if not tracker.steps_seen()
                    else (
                        "checkpoint"
                        if any(p.in_checkpoint for p in tracker.progress.values())
                        else "training"
                    )
                )
                ht = hang_timeout(list(tracker.step_times), cfg.hang_policy)
                timeout = ht.seconds if phase == "training" else max(ht.seconds, cfg.startup_timeout_s)
                if ht.calibrated and not calibrated_reported:
                    calibrated_reported = True
                    self.emit(
                        TimeoutsCalibrated(
                            ts=now,
                            hang_timeout_s=ht.seconds,
                            p99_step_s=ht.p99_s,
                            samples=ht.samples,
                            reason=ht.reason,
                            **self._ctx(),
                        ),
                        show=False,
                    )
                # declare the hang up to one tick before the timeout, so that detection never lands
                # after it, whatever the poll phase (the loop also sleeps exactly to the deadline)
                verdict = detect_hang(tracker, now + tick, timeout, phase)
                if verdict is not None:
                    if raised := self._raised_not_exited(group, specs):  # an exception still exiting
                        return self._fail_crash(group, raised, tracker, specs)
                    return self._fail_hang(group, verdict, tracker, ht.reason, step=verdict.step)
                live = [p.last_msg for p in tracker.progress.values() if not p.finished and p.sdk]
                hang_deadline = (min(live) + timeout - tick) if live else now + tick

            # 4. membership: a node waiting to join (replacement or scale-up)
            if self._rdzv is not None and now - last_membership_check > 1.0:
                last_membership_check = now
                try:
                    waiting = self._rdzv.num_nodes_waiting()
                except Exception:  # noqa: BLE001 - the store may be briefly unreachable
                    waiting = 0
                if waiting > 0:
                    group.stop(cfg.stop_grace_s)
                    self.emit(
                        WorkersStopped(
                            ts=time.time(), reason=f"{waiting} node(s) waiting to join", **self._ctx()
                        )
                    )
                    return AttemptOutcome("membership")
            time.sleep(max(0.001, min(tick, hang_deadline - time.time())))

    def _check_stragglers(self, recent, flagged: dict[int, float], step: int) -> None:
        """Score the ranks over the last window of steps; record a straggler when one appears or clears."""
        rep = score_ranks(recent, STRAGGLER_THRESHOLD, min_steps=STRAGGLER_WINDOW // 2)
        now_slow = {r.rank: r.score for r in rep.stragglers}
        for rank, score in now_slow.items():
            if rank not in flagged:
                self.emit(
                    StragglerDetected(
                        ts=time.time(), rank=rank, score=score, step=step, evidence=rep.reason, **self._ctx()
                    )
                )
        for rank in set(flagged) - set(now_slow):
            score = next((r.score for r in rep.ranks if r.rank == rank), 1.0)
            self.emit(StragglerCleared(ts=time.time(), rank=rank, score=score, step=step, **self._ctx()))
        flagged.clear()
        flagged.update(now_slow)

    def _release_spares(self) -> None:
        """Tell hot spares the job is done (they poll every 0.5 s; keep the store up that long)."""
        if self._round_store is None or not self._spares_waiting or self._group_rank != 0:
            return
        try:
            self._round_store.set("stalwart/done", "1")
            time.sleep(1.5)
        except Exception:  # noqa: BLE001 - best effort: spares also leave when the store goes away
            pass

    # --- failure handling ------------------------------------------------------------------

    def _fail_crash(
        self, group: WorkerGroup, failed: dict[int, int], tracker: ProgressTracker, specs: list[WorkerSpec]
    ) -> AttemptOutcome:
        detected = time.time()
        logs = {s.global_rank: s.log_path for s in specs}
        errors = {r: self._error_of(r, logs.get(r)) for r in failed}

        # root cause: a user exception first, then a signal death, then the earliest exit
        def rank_key(r: int) -> tuple[int, float]:
            kind = classify(failed[r], errors[r])
            order = {"exception": 0, "crash": 1, "peer_lost": 2}[kind]
            return order, group.exit_times.get(r, detected)

        root = min(failed, key=rank_key)
        code, err = failed[root], errors[root]
        kind = classify(code, err)
        progress = tracker.progress[root]
        step = err.step if err is not None and err.step >= 0 else progress.step
        # onset: an exception stamps its own time; a signal death happened after the rank's last
        # message and before the agent saw the exit (one tick later at most): take the message
        onset = min(group.exit_times.get(root, detected), detected)
        if err is not None and err.ts > 0:
            onset = min(onset, err.ts)
        elif progress.last_msg > tracker.started:
            onset = min(onset, progress.last_msg)
        evidence = describe_exit(code)
        if err is not None:
            evidence += f"; {err.signature}"
        group.stop(0.0)  # the group is broken: nothing left to save, do not wait out a grace period
        log = tail(logs.get(root), 3)
        self._note(f"rank {root} failed ({evidence}); its log: {logs.get(root)}")
        shown = tail_lines(logs.get(root), 8, match="Traceback (most recent call last)")
        if shown:
            self._note(f"last lines of rank {root}:\n{shown}")
        self.emit(
            FailureDetected(
                ts=detected,
                failure=kind,
                evidence=evidence,
                onset=onset,
                step=step,
                rank=root,
                exit_code=code,
                signal=describe_exit(code) if code < 0 else "",
                error_type=err.type if err else "",
                error_message=err.message[:500] if err else "",
                **self._ctx(),
            )
        )
        if log and kind != "crash":
            self.emit(
                StackCaptured(
                    ts=time.time(),
                    rank=root,
                    stack=err.traceback if err else log,
                    reason="traceback of the failed rank",
                    **self._ctx(),
                ),
                show=False,
            )
        self.emit(WorkersStopped(ts=time.time(), reason=f"rank {root} {evidence}", **self._ctx()), show=False)
        failure = Failure(
            kind=kind,
            attempt=self.attempt,
            step=step,
            rank=root,
            evidence=evidence,
            signature=err.signature if err is not None else "",
            progressed=tracker.steps_seen(),
            sdk=bool(tracker.sdk_ranks()),
        )
        return AttemptOutcome("failed", failure, detected)

    def _error_of(self, rank: int, log: Path | None) -> ErrorRecord | None:
        """Root cause of a failed rank: the SDK's error file, torch elastic's ``@record`` file, or the
        last traceback in the rank's log."""
        node = self.cfg.node_name
        err = read_error(self.run.error_file(node, self.attempt, rank))
        if err is None:
            err = read_elastic_error(self.run.elastic_error_file(node, self.attempt, rank))
        if err is None and log is not None:
            time.sleep(0.05)  # the output pumps may still be copying the last lines
            err = error_from_log(tail_lines(log, 400))
        return err

    def _raised_not_exited(self, group: WorkerGroup, specs: list[WorkerSpec]) -> dict[int, int]:
        """Ranks that recorded an exception in this attempt: a worker slow to exit after raising
        (on a loaded machine) is an exception, not a hang. Waits a bounded time for their exits."""
        node = self.cfg.node_name
        ranks = [
            s.global_rank
            for s in specs
            if self.run.error_file(node, self.attempt, s.global_rank).exists()
            or self.run.elastic_error_file(node, self.attempt, s.global_rank).exists()
        ]
        if not ranks:
            return {}
        deadline = time.monotonic() + max(2.0, self.cfg.stop_grace_s)
        while time.monotonic() < deadline and any(group.poll().get(r) is None for r in ranks):
            time.sleep(0.05)
        codes = group.poll()
        return {r: c if c not in (None, 0) else 1 for r in ranks for c in (codes.get(r),)}

    def _fail_hang(
        self, group: WorkerGroup, verdict, tracker: ProgressTracker, why: str, *, step: int
    ) -> AttemptOutcome:
        detected = time.time()
        self.emit(
            FailureDetected(
                ts=detected,
                failure="hang",
                evidence=f"{verdict.evidence}; {why}",
                onset=verdict.onset,
                step=step,
                rank=verdict.culprit,
                **self._ctx(),
            )
        )
        # faulthandler is the SDK's: without it SIGUSR2 would only kill the workers
        stacks = self._capture_stacks(group) if tracker.sdk_ranks() else {}
        for rank, text in stacks.items():
            reason = "hung rank" if rank == verdict.culprit else "peer of the hung rank"
            self.emit(
                StackCaptured(ts=time.time(), rank=rank, stack=text, reason=reason, **self._ctx()),
                show=rank == verdict.culprit,
            )
        group.stop(0.0)
        self.emit(
            WorkersStopped(ts=time.time(), reason=f"hang of rank {verdict.culprit}", **self._ctx()),
            show=False,
        )
        failure = Failure(
            kind="hang",
            attempt=self.attempt,
            step=step,
            rank=verdict.culprit,
            evidence=verdict.evidence,
            progressed=tracker.steps_seen(),
            sdk=bool(tracker.sdk_ranks()),
        )
        return AttemptOutcome("failed", failure, detected)

    def _capture_stacks(self, group: WorkerGroup, wait_s: float = 0.5) -> dict[int, str]:
        """faulthandler in each worker dumps every thread's Python stack on SIGUSR2."""
        paths = {r: self.run.stack_file(self.cfg.node_name, self.attempt, r) for r in group.procs}
        sizes = {r: (p.stat().st_size if p.exists() else 0) for r, p in paths.items()}
        group.signal(signal.SIGUSR2)
        deadline = time.monotonic() + wait_s
        out: dict[int, str] = {}
        while time.monotonic() < deadline and len(out) < len(paths):
            for r, p in paths.items():
                if r not in out and p.exists() and p.stat().st_size > sizes[r]:
                    time.sleep(0.05)  # let the dump finish
                    with open(p) as fh:
                        fh.seek(sizes[r])
                        out[r] = fh.read()
            time.sleep(0.02)
        return out

    # --- chaos on the agent side -------------------------------------------------------------

    def _agent_chaos(self, tracker: ProgressTracker) -> None:
        for fault in self.plan.agent_faults():
            if fault.step is None or tracker.max_done_step + 1 < fault.step:
                continue
            if fault.kind == "kill-agent":
                if fault.node != self._group_rank or not claim(self.run.chaos, fault):
                    continue
                self.emit(
                    ChaosInjected(
                        ts=time.time(),
                        fault=fault.kind,
                        step=fault.step,
                        detail=fault.describe(),
                        **self._ctx(),
                    )
                )
                os.kill(os.getpid(), signal.SIGKILL)
            elif self._group_rank == 0:
                target = chaos_actions.newest_checkpoint(self.run.checkpoints)
                if target is None or not claim(self.run.chaos, fault):
                    continue
                detail = chaos_actions.damage(target, fault.kind)
                self.emit(
                    ChaosInjected(
                        ts=time.time(), fault=fault.kind, step=fault.step, detail=detail, **self._ctx()
                    )
                )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_addr(endpoint: str) -> str:
    host = endpoint.rpartition(":")[0] or endpoint
    if host in ("localhost", "") or host.startswith("127."):
        return "127.0.0.1"
    return socket.gethostname()
