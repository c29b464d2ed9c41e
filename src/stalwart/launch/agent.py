"""The node agent behind ``stalwart run``: rendezvous, spawn, supervise, decide, restart.

One agent per node. Agents meet through torch.distributed.elastic's c10d rendezvous (as torchrun
does). Each rendezvous round gets a fresh master port for the workers' own TCPStore, so restarted
workers never see stale keys from an earlier round (the shared-store hang of torch >= 2.5).

Collect -> decide -> act: each attempt is watched by a ``Supervisor`` (launch/supervisor.py) that
gathers a frozen snapshot per tick, asks the monitors (launch/monitors.py: worker exits, durability,
signals, hangs, membership, stragglers) in a fixed order and applies the first decision that ends the
attempt; this module runs the attempts (rendezvous, spawn, restart policy, verdict) and writes every
step of it to the ledger. Time comes from an injected clock (launch/clock.py).
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ..chaos.once import claim
from ..chaos.plan import FaultPlan, build_plan
from ..errors import CheckpointError, ConfigError, LedgerFullError, StalwartError
from ..events import (
    AttemptEnded,
    AttemptStarted,
    ChaosInjected,
    DecisionTaken,
    Event,
    JobEnded,
    JobStarted,
    StepCompleted,
    WorkersStarted,
)
from ..exit_codes import (
    EXIT_INFRA,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
    REQUEUE_HELPS,
)
from ..ledger import LedgerWriter
from ..policy.restart_policy import Failure, decide
from ..policy.world_size import plan_world
from ..protocol import WorkerEnv, control, elastic_env
from ..protocol.error_record import ErrorRecord, error_from_log, read_elastic_error, read_error
from ..protocol.run_dir import RunDir
from . import chaos_actions
from .clock import Clock, SystemClock
from .config import CONFIG_SETTINGS, RunConfig
from .decision import AttemptOutcome
from .output import routes
from .progress import ProgressTracker
from .supervisor import Hooks, Supervisor
from .warm import WarmPool, choose_path
from .workers import WorkerGroup, WorkerSpec, tail_lines


class Agent:
    def __init__(
        self,
        cfg: RunConfig,
        *,
        notify: Callable[[Event], None] | None = None,
        progress: Callable[[int, int, int, float], None] | None = None,
        started: float | None = None,
        note: Callable[[str], None] | None = None,
        clock: Clock | None = None,
    ):
        self.cfg = cfg
        self.run = RunDir(cfg.run_dir).create()
        self.clock: Clock = clock or SystemClock()
        self.started = started or self.clock.now()
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
        self._plan = None  # this attempt's world plan (the straggler-action policy weighs it)
        self._chaos_done_step = -1  # the newest step done that agent-side chaos has seen
        self._chaos_targets: dict[str, int] = {}  # checkpoint damage: the version step each aims at
        self._left = False  # this node left the job (excluded): the rendezvous stays open for the others
        self._memory = None  # the node memory tier and peer store (checkpoint/node_memory.py)

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
        self._diagnosis = None
        self._routed: dict[str, str] = {}
        self._warm: WarmPool | None = None
        try:  # everything started for the job is inside: the finally stops whatever did start
            self._memory = self._node_memory()
            self._diagnosis = self._start_diagnosis()
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
            return self._loop()
        except BaseException as exc:
            # an agent bug or an unexpected stop still leaves a verdict in the ledger
            self._end("agent_error", f"agent error: {type(exc).__name__}: {exc}", EXIT_INFRA)
            raise
        finally:
            if self._diagnosis is not None:
                self._diagnosis.stop()
            for s, h in previous.items():
                signal.signal(s, h)
            if self._rdzv is not None and not self._left:  # closing it would end the job for every node
                try:
                    self._rdzv.shutdown()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            self._close_worker_store()
            if self._memory is not None:
                self._memory.close()  # the node's memory tier and peer copies go with the job
            if self._warm is not None:
                self._warm.close()
            self.ledger.close()

    def _node_memory(self):
        """The node's memory tier directory and (several nodes meeting by c10d) its peer store."""
        from ..checkpoint.node_memory import NodeMemory

        cfg = self.cfg
        host = (
            (cfg.local_addr or _local_addr(cfg.rdzv_endpoint)) if cfg.use_c10d and cfg.max_nodes > 1 else None
        )
        try:
            return NodeMemory(run_id=cfg.run_id, node=cfg.node_name, host=host)
        except (OSError, CheckpointError) as exc:  # no tmpfs, or not ours: the job runs from disk
            self._note(f"no node memory tier ({exc}); checkpoints restore from disk only")
            return None

    def _start_diagnosis(self):
        """The live diagnosis collector (diagnose/live.py) on its own thread; None when turned off."""
        if not self.cfg.diagnose_interval_s:
            return None
        from ..diagnose.live import LiveDiagnosis

        src = self.cfg.diagnosis_sources()
        return LiveDiagnosis(
            self.run,
            self.cfg.node_name,
            self.cfg.run_id,
            src,
            notify=self._notify,
            attempt=lambda: self.attempt,
        ).start()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signal = signum

    def _end(self, outcome: str, verdict: str, code: int) -> int:
        self.emit(
            JobEnded(
                ts=self.clock.now(),
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
            now=self.clock.now(),
            state_dir=cfg.health_state_dir,
            fixture=cfg.health_fixture,
            active=cfg.health_active and self.attempt > 0,
            backend=cfg.health_backend,
        )
        if res.passed:
            return ""
        self._left = True
        self.emit(
            DecisionTaken(
                ts=self.clock.now(),
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
                    DecisionTaken(ts=self.clock.now(), action="plan_world", reason=plan.reason, **self._ctx())
                )
            self._spares_waiting = bool(plan.spares)
            self._plan = plan
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
            if outcome.status == "excluded":
                self._left = True
                return self._end(
                    "node_excluded",
                    f"node {self.cfg.node_name} excluded as a straggler and quarantined: {outcome.detail}; "
                    "the other nodes continue without it",
                    EXIT_INFRA,
                )
            if outcome.status == "membership":
                self.emit(
                    DecisionTaken(
                        ts=self.clock.now(),
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
                    ts=self.clock.now(),
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
                self.clock.sleep(d.backoff_s)
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
        if self._memory is not None:
            self._memory.exchange(store, group_rank, num_nodes)
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
        kwargs = {"timeout": datetime.timedelta(seconds=self.cfg.pg_timeout_s), "wait_for_workers": False}
        try:
            try:
                store = TCPStore(host, port, None, True, master_listen_fd=fd, **kwargs)
            except NotImplementedError:  # torch 2.6: its libuv server cannot take a listening socket
                store = TCPStore(host, port, None, True, master_listen_fd=fd, use_libuv=False, **kwargs)
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
            DecisionTaken(
                ts=self.clock.now(), action="standby", reason=f"hot spare: {plan.reason}", **self._ctx()
            )
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
            self.clock.sleep(0.5)

    def _make_handler(self):
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        cfg = self.cfg
        # torch shares one TCPStore across rounds and writes MASTER_ADDR into a round's store only
        # when its rank 0 is new to that role: a node joining a group whose rank 0 already led
        # the previous round waits on the key forever. Stalwart never hands that store to workers.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
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
        self,
        group_rank: int,
        num_nodes: int,
        addr: str,
        port: int,
        receiver,
        ctl: Path,
        route: dict[str, str] | None = None,
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
            env = {**inherited, **(route or {})}
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
                    **(self._memory.env() if self._memory is not None else {}),
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
        from ..protocol.pipe import Receiver

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
        specs = self._worker_specs(group_rank, num_nodes, addr, port, receiver, ctl, self._route_around())
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
        if outcome.status == "failed":  # a damage that waited on a persist the failure cut short
            self._agent_chaos_at(self._chaos_done_step, settled=True)
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
        """One attempt's supervision: the monitors decide, the supervisor acts (launch/supervisor.py)."""
        hooks = Hooks(
            ctx=self._ctx,
            emit=self.emit,
            record=self.record,
            note=self._note,
            progress=self._progress,
            signal=lambda: self._signal,
            nodes_waiting=self._rdzv.num_nodes_waiting if self._rdzv is not None else None,
            error_of=self._error_of,
            raised_not_exited=lambda: self._raised_not_exited(group, specs),
            raised_since=lambda: self._raised_since(specs),
            capture_stacks=lambda: self._capture_stacks(group),
            release_spares=self._release_spares,
            chaos=self._agent_chaos,
            quarantine=self._quarantine,
        )
        return Supervisor(
            cfg=self.cfg,
            hooks=hooks,
            group=group,
            receiver=receiver,
            block=block,
            specs=specs,
            clock=self.clock,
            attempt=self.attempt,
            node=self.cfg.node_name,
            world=self._plan,
            straggler_gate=self._straggler_gate(),
        ).run()

    def _straggler_gate(self):
        """Whether this attempt may act on the straggler policy's verdicts: the mode, and the detector's
        precision measured over the history before this attempt (read only when not observe-only)."""
        from ..diagnose.straggler_action import straggler_gate
        from .straggler_exclusion import listens_on, straggler_precision

        cfg = self.cfg
        stats, cannot_leave = None, ""
        if cfg.straggler_action != "observe" and self._rdzv is not None:
            port = int(cfg.rdzv_endpoint.rpartition(":")[2])
            if listens_on(port):
                cannot_leave = (
                    f"this agent hosts the c10d rendezvous store ({cfg.rdzv_endpoint}): leaving would end "
                    "the job for every node"
                )
        if cfg.straggler_action != "observe":
            stats, unread = straggler_precision(
                self.run.root, cfg.straggler_history, cfg.run_id, self.attempt
            )
            for why in unread[:3]:
                self._note(f"straggler precision: history not read: {why}")
        return straggler_gate(
            cfg.straggler_action,
            stats,
            min_precision=cfg.straggler_act_min_precision,
            min_firings=cfg.straggler_act_min_firings,
            cannot_leave=cannot_leave,
        )

    def _route_around(self) -> dict[str, str]:
        """The NCCL environment changes this node's workers start with once a sick link of the node
        was routed around (decided by the live collector, asked for one more round here so a failure
        just detected counts for this very start). A new change is recorded as a decision and flags
        the node for repair: it stays in the job, suspect, until re-validated."""
        from ..health.lifecycle import CheckOutcome

        if self._diagnosis is None:
            return {}
        if self.attempt > 0:  # the first start has no failure to diagnose yet
            self._diagnosis.refresh()
        route = self._diagnosis.route_env()
        if route != self._routed:
            change = " ".join(f"{k}={v}" for k, v in sorted(route.items()))
            state = self._flag_node(
                CheckOutcome(
                    status="warn", reason=f"repair: a sick link routed around ({change})", fault_key="link"
                )
            )
            self.emit(
                DecisionTaken(
                    ts=self.clock.now(),
                    action="route_around_hca",
                    reason=f"{self.cfg.node_name}'s workers start with {change}, leaving the sick link out; "
                    f"node flagged for repair: {state}",
                    **self._ctx(),
                )
            )
            self._routed = route
        return route

    def _flag_node(self, outcome) -> str:
        from ..health.node_controller import record_outcome

        try:
            return record_outcome(
                self.cfg.node_name,
                outcome,
                now=self.clock.now(),
                state_dir=self.cfg.health_state_dir or self.run.root / "health",
                backend=self.cfg.health_backend,
            )
        except (StalwartError, OSError) as exc:  # the job goes on; the decision says the flag did not stick
            return f"not recorded ({getattr(exc, 'message', None) or exc})"

    def _quarantine(self, node: str, reason: str) -> str:
        from .straggler_exclusion import quarantine_node

        return quarantine_node(
            node,
            reason,
            now=self.clock.now(),
            state_dir=self.cfg.health_state_dir or self.run.root / "health",
            backend=self.cfg.health_backend,
        )

    def _release_spares(self) -> None:
        """Tell hot spares the job is done (they poll every 0.5 s; keep the store up that long)."""
        if self._round_store is None or not self._spares_waiting or self._group_rank != 0:
            return
        try:
            self._round_store.set("stalwart/done", "1")
            self.clock.sleep(1.5)
        except Exception:  # noqa: BLE001 - best effort: spares also leave when the store goes away
            pass

    # --- failure handling ------------------------------------------------------------------

    def _error_of(self, rank: int, log: Path | None) -> ErrorRecord | None:
        """Root cause of a failed rank: the SDK's error file, torch elastic's ``@record`` file, or the
        last traceback in the rank's log."""
        node = self.cfg.node_name
        err = read_error(self.run.error_file(node, self.attempt, rank))
        if err is None:
            err = read_elastic_error(self.run.elastic_error_file(node, self.attempt, rank))
        if err is None and log is not None:
            self.clock.sleep(0.05)  # the output pumps may still be copying the last lines
            err = error_from_log(tail_lines(log, 400))
        return err

    def _raised_since(self, specs: list[WorkerSpec]) -> dict[int, float]:
        """Rank -> the time it wrote this attempt's error record (stalwart's or torch elastic's)."""
        node, out = self.cfg.node_name, {}
        for s in specs:
            for path in (
                self.run.error_file(node, self.attempt, s.global_rank),
                self.run.elastic_error_file(node, self.attempt, s.global_rank),
            ):
                try:
                    out[s.global_rank] = min(out.get(s.global_rank, math.inf), path.stat().st_mtime)
                except OSError:
                    pass
        return out

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
        deadline = self.clock.monotonic() + max(2.0, self.cfg.stop_grace_s)
        while self.clock.monotonic() < deadline and any(group.poll().get(r) is None for r in ranks):
            self.clock.sleep(0.05)
        codes = group.poll()
        return {r: c if c not in (None, 0) else 1 for r in ranks for c in (codes.get(r),)}

    def _capture_stacks(self, group: WorkerGroup, wait_s: float = 0.5) -> dict[int, str]:
        """faulthandler in each worker dumps every thread's Python stack on SIGUSR2."""
        paths = {r: self.run.stack_file(self.cfg.node_name, self.attempt, r) for r in group.procs}
        sizes = {r: (p.stat().st_size if p.exists() else 0) for r, p in paths.items()}
        group.signal(signal.SIGUSR2)
        deadline = self.clock.monotonic() + wait_s
        out: dict[int, str] = {}
        while self.clock.monotonic() < deadline and len(out) < len(paths):
            for r, p in paths.items():
                if r not in out and p.exists() and p.stat().st_size > sizes[r]:
                    self.clock.sleep(0.05)  # let the dump finish
                    with open(p) as fh:
                        fh.seek(sizes[r])
                        out[r] = fh.read()
            self.clock.sleep(0.02)
        return out

    # --- chaos on the agent side -------------------------------------------------------------

    def _agent_chaos(self, tracker: ProgressTracker) -> None:
        self._chaos_done_step = tracker.max_done_step
        self._agent_chaos_at(tracker.max_done_step, settled=False)

    def _agent_chaos_at(self, done_step: int, *, settled: bool) -> None:
        """Agent-side faults due once step ``done_step + 1`` is reached. Checkpoint damage aims at the
        newest version when it is due, committed or still being persisted, and waits for that one's
        commit (``settled``: the workers are gone and nothing more will commit: the newest that did)."""
        for fault in self.plan.agent_faults():
            if fault.step is None or done_step + 1 < fault.step:
                continue
            if fault.kind == "kill-agent":
                if fault.node != self._group_rank or not claim(self.run.chaos, fault):
                    continue
                self.emit(
                    ChaosInjected(
                        ts=self.clock.now(),
                        fault=fault.kind,
                        step=fault.step,
                        detail=fault.describe(),
                        **self._ctx(),
                    )
                )
                os.kill(os.getpid(), signal.SIGKILL)
            elif self._group_rank == 0:
                disk = self.run.checkpoints
                faster = [self._memory.versions_root] if self._memory is not None else []
                key = fault.describe()
                if key not in self._chaos_targets:  # pin the newest version, committed or on its way
                    newest = chaos_actions.newest_on_its_way(disk, faster)
                    if newest >= 0:
                        self._chaos_targets[key] = newest
                pinned = self._chaos_targets.get(key, -1)
                target = chaos_actions.committed(disk, pinned) if pinned >= 0 else None
                if target is None and not settled:
                    continue  # not on disk yet: wait for its commit (or for the attempt to fail)
                target = target or chaos_actions.newest_checkpoint(disk)
                if target is None or not claim(self.run.chaos, fault):
                    continue
                detail = chaos_actions.damage(target, fault.kind)
                mem = self._memory.version_dir(target.name) if self._memory is not None else None
                if mem is not None:  # and the node memory tier's copy of the same version
                    detail += "; " + chaos_actions.damage(mem, fault.kind)
                self.emit(
                    ChaosInjected(
                        ts=self.clock.now(), fault=fault.kind, step=fault.step, detail=detail, **self._ctx()
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
