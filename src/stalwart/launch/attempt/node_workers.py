"""This node's workers for one attempt: their environment (torchrun's, exactly), their start (warm from
the fork server, or cold), and their supervision (launch/attempt/supervisor.py) to an outcome.

Implements :class:`stalwart.launch.ports.WorkerLauncher`, and :class:`stalwart.launch.ports.JobLink`
for the supervisor (the agent's signal, nodes waiting to join, hot spares, quarantine)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...chaos.plan import FaultPlan
from ...diagnose.straggler_action import straggler_gate
from ...errors import StalwartError
from ...events import AttemptEnded, AttemptStarted, DecisionTaken, WorkersStarted
from ...health.findings import CheckStatus
from ...health.lifecycle import CheckOutcome
from ...health.link_counters import LinkSampler
from ...health.node_controller import record_outcome
from ...health.node_store import HealthStore
from ...policy.job import AttemptStatus, TookOver
from ...policy.world_size import WorldPlan
from ...protocol import WorkerEnv, control, elastic_env
from ...protocol.pipe import Receiver
from ...protocol.run_dir import RunDir
from ...settings.run_config import CONFIG_SETTINGS, RunConfig
from ..agent_chaos import AgentChaos
from ..clock import Clock
from ..decision import AttemptOutcome
from ..failure_files import AttemptFiles
from ..inplace.board import StoreBoard
from ..inplace.rejoin import find_place
from ..inplace.spare_takeover import SpareWatch, lost_node_records
from ..ledger_sink import NodeLedger
from ..output import routes
from ..ports import Console, Round
from ..processes.bootstrap import BOOT_CODE
from ..processes.warm_pool import WarmPool, choose_path
from ..processes.worker_group import StartPath, WorkerGroup, WorkerSpec
from ..rendezvous.node_rendezvous import NodeRendezvous, local_addr
from .straggler_exclusion import listens_on, quarantine_node, straggler_precision
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ...checkpoint.node_memory import NodeMemory
    from ...diagnose.live import LiveDiagnosis


def argv(cfg: RunConfig) -> list[str]:
    """The workers' command line (torchrun's --run-path, --no-python, -m, or a script)."""
    if cfg.run_path:
        head = [
            cfg.python,
            "-u",
            "-c",
            "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            cfg.script,
        ]
    elif cfg.no_python:
        head = [cfg.script]
    elif cfg.workers.instrument:  # zero: through the worker bootstrap (launch/processes/bootstrap.py)
        head = [cfg.python, "-u", "-c", BOOT_CODE, *(["-m"] if cfg.module else []), cfg.script]
    elif cfg.module:
        head = [cfg.python, "-u", "-m", cfg.script]
    else:
        head = [cfg.python, "-u", cfg.script]
    return head + list(cfg.script_args)


class NodeWorkers:
    def __init__(
        self,
        cfg: RunConfig,
        *,
        run: RunDir,
        clock: Clock,
        ledger: NodeLedger,
        console: Console,
        faults: FaultPlan,
        chaos: AgentChaos,
        rendezvous: NodeRendezvous | None = None,
        signal: Callable[[], int | None] = lambda: None,
        memory: NodeMemory | None = None,
        diagnosis: LiveDiagnosis | None = None,
        warm: WarmPool | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.clock, self.ledger, self.console = cfg, run, clock, ledger, console
        self.faults, self.chaos, self.rendezvous, self._signal = faults, chaos, rendezvous, signal
        self.memory, self.diagnosis, self.warm = memory, diagnosis, warm
        self.attempt = 0
        self.group_rank = 0  # this node's place in the attempt's world
        self.world: WorldPlan | None = None  # this attempt's world plan (the straggler policy weighs it)
        self.routed: dict[str, str] = {}  # the NCCL environment changes of a sick link routed around
        self.spare: SpareWatch | None = None  # a hot spare's watch for a lost node's place
        self.joining = 0  # > 0: this attempt's ranks replace a lost node's, in this generation
        self.newcomer = False  # ... or take a free place in a group that grows back in place
        self.step_times: dict[str, tuple[float, ...]] = {}  # by world size: a restart's hang calibration

    # --- the attempt ---------------------------------------------------------------------------------

    def run(self, attempt: int, plan: WorldPlan, met: Round) -> AttemptOutcome:

        cfg = self.cfg
        self.attempt, self.world = attempt, plan
        self.group_rank = self.chaos.group_rank = plan.active.index(cfg.node_name)
        num_nodes = len(plan.active)
        self.ledger.emit(
            AttemptStarted(
                ts=self.clock.now(),
                world_size=num_nodes * cfg.nproc_per_node,
                group_rank=self.group_rank,
                num_nodes=num_nodes,
                master=f"{met.addr}:{met.port}",
                **self.ledger.ctx(),
            )
        )
        ctl = self.run_dir.control_file(cfg.node_name, os.getpid(), attempt)
        control.create(ctl, slots=cfg.nproc_per_node)
        block = control.ControlBlock(ctl, writable=True)
        receiver = Receiver()
        specs = self.worker_specs(
            self.group_rank, num_nodes, met.addr, met.port, receiver, ctl, self._route_around()
        )
        warm, path_reason, forced = self._warm_path()
        group = WorkerGroup(argv(cfg), specs, warm=warm)
        board, leaving = None, False
        rdzv = self.rendezvous
        if num_nodes > 1 and cfg.reform.enabled and rdzv is not None:  # in-place re-formation across nodes
            # the first node watches the others' heartbeats in an incident; the rest read the version
            others = tuple(n for n in plan.active if n != cfg.node_name) if self.group_rank == 0 else ()
            board = StoreBoard(
                met.addr,
                met.port,
                cfg.rendezvous.store_timeout_s,
                self.console.note,
                node=cfg.node_name,
                watch=others,
                signer=rdzv.signer,
                live_host=cfg.rendezvous.local_addr or local_addr(cfg.rendezvous.endpoint),
            )
        try:
            pids = group.start()
            for spec in specs:  # the workers hold their write ends now
                os.close(spec.ipc_fd)
            self._path_taken(group, path_reason, forced)
            self.ledger.emit(
                WorkersStarted(
                    ts=self.clock.now(),
                    pids=tuple(pids),
                    global_ranks=tuple(s.global_rank for s in specs),
                    **self.ledger.ctx(),
                ),
                show=False,
            )
            outcome = self._supervise(group, receiver, block, specs, board)
            leaving = outcome.status is AttemptStatus.EXCLUDED  # the job goes on without this node
        finally:
            self.joining, self.newcomer = 0, False
            if board is not None:
                board.close(leaving)
            if self.spare is not None:  # its announcement was written long before the attempt ended
                self.spare.close()
                self.spare = None
            receiver.close()
            block.close()
            group.close()
        if outcome.status is AttemptStatus.FAILED:  # a damage that waited on a persist the failure cut short
            self.chaos.settle()
        self.ledger.emit(
            AttemptEnded(ts=self.clock.now(), reason=str(outcome.status), **self.ledger.ctx()), show=False
        )
        return outcome

    def take_over(self, plan: WorldPlan, met: Round) -> TookOver | None:
        """A hot spare's check, each stand-by poll: a lost node's place taken in place (never waits)."""
        if self.rendezvous is None or not self.cfg.reform.enabled:
            return None
        if self.spare is None or self.spare.plan != plan:
            if self.spare is not None:
                self.spare.close()
            self.spare = SpareWatch.open(self.cfg, plan, met, self.console.note, self.rendezvous.signer)
        took = self.spare.poll()
        if took is not None and self.spare.claiming is not None:
            self.joining = self.spare.generation
            lost_node_records(self.cfg, self.ledger, self.clock.now(), took, self.spare)
        return took

    def rejoin(self) -> tuple[TookOver, Round] | None:
        """Before this node joins the rendezvous: a place in a running group that shrank in place,
        offered and taken (launch/inplace/rejoin.py), or None (the rendezvous decides, as before)."""
        if self.rendezvous is None or not self.cfg.reform.enabled or self.cfg.max_nodes < 2:
            return None
        place = find_place(self.cfg, self.rendezvous, self.clock, self.console.note)
        if place is None:
            return None
        self.joining, self.newcomer = place.generation, True
        return TookOver(place.plan, place.reason), place.met

    def worker_specs(
        self,
        group_rank: int,
        num_nodes: int,
        addr: str,
        port: int,
        receiver,
        ctl: Path,
        route: dict[str, str] | None = None,
    ) -> list[WorkerSpec]:
        cfg, attempt = self.cfg, self.attempt
        inherited = WorkerEnv.strip(os.environ, set(CONFIG_SETTINGS))
        log_dir = (
            cfg.logs.log_dir / cfg.run_id / f"attempt_{attempt}" if cfg.logs.log_dir is not None else None
        )
        run_logs = [
            self.run_dir.log_file(cfg.node_name, attempt, group_rank * cfg.nproc_per_node + local)
            for local in range(cfg.nproc_per_node)
        ]
        out_routes = routes(
            nproc=cfg.nproc_per_node,
            redirects=cfg.logs.redirects,
            tee=cfg.logs.tee,
            ranks_filter=cfg.logs.local_ranks_filter,
            log_dir=log_dir,
            run_log=run_logs,
            log_root=cfg.logs.log_dir,
        )
        specs = []
        for local in range(cfg.nproc_per_node):
            rank = group_rank * cfg.nproc_per_node + local
            fd = receiver.new_channel()
            env = {**inherited, **(route or {})}
            env.update(self._elastic_env(rank, local, group_rank, num_nodes, addr, port))
            env.update(self._stalwart_env(fd, ctl, self.joining))
            if cfg.workers.virtual_local_rank and "CUDA_VISIBLE_DEVICES" not in os.environ:
                env["CUDA_VISIBLE_DEVICES"] = str(local)
            env["PYTHONUNBUFFERED"] = "1"
            env.setdefault("OMP_NUM_THREADS", "1")
            specs.append(
                WorkerSpec(
                    local,
                    rank,
                    env,
                    run_logs[local],
                    ipc_fd=fd,
                    route=out_routes[local],
                    role=cfg.workers.role,
                )
            )
        return specs

    def _elastic_env(
        self, rank: int, local: int, group_rank: int, num_nodes: int, addr: str, port: int
    ) -> dict[str, str]:
        cfg = self.cfg
        return elastic_env(
            rank=rank,
            local_rank=0 if cfg.workers.virtual_local_rank else local,
            world=num_nodes * cfg.nproc_per_node,
            local_world=cfg.nproc_per_node,
            group_rank=group_rank,
            group_world=num_nodes,
            role=cfg.workers.role,
            master_addr=addr,
            master_port=port,
            restart_count=self.attempt,
            max_restarts=cfg.restart.max_restarts,
            run_id=cfg.rendezvous.id,
            error_file=str(self.run_dir.elastic_error_file(cfg.node_name, self.attempt, rank)),
            use_agent_store=True,  # an agent hosts the store; workers only connect to it
        )

    def _stalwart_env(self, fd: int, ctl: Path, generation: int = 0) -> dict[str, str]:
        cfg = self.cfg
        return WorkerEnv(
            run_dir=str(self.run_dir.root),
            run_id=cfg.run_id,
            node=cfg.node_name,
            attempt=self.attempt,
            ipc_fd=fd,
            control=str(ctl),
            agent_pid=os.getpid(),
            pg_timeout_s=cfg.hang.pg_timeout_s,
            # a survivor waits (bounded) for the agent's word; with several nodes the agent gives up on
            # another node's announcement after --in-place-announce-timeout (launch/inplace/recovery.py)
            reform_timeout_s=cfg.reform.timeout_s if cfg.reform.enabled else 0.0,
            chaos=self.faults.to_json(),
            history_mtbf_s=self._history_mtbf(),
            sdc_every=cfg.sdc.every,
            sdc_budget=cfg.sdc.budget,
            leave_state=cfg.reform.leave_state,
            generation=generation,
            **(self.memory.env() if self.memory is not None else {}),
        ).to_env()

    def _history_mtbf(self) -> float:
        """This node's MTBF from its health history (0: none, or the store unreadable), for the
        workers' ``--checkpoint-every auto`` when their run has not failed yet."""

        state_dir = self.cfg.health.state_dir or self.run_dir.root / "health"
        if not state_dir.is_dir():
            return 0.0
        try:
            got = HealthStore(state_dir).failure_mtbf(self.cfg.node_name, self.clock.now())
        except Exception:  # noqa: BLE001 - a history that cannot be read only loses this estimate
            return 0.0
        return got or 0.0

    def _warm_path(self) -> tuple[WarmPool | None, str, bool]:
        """Offer the fork server to this attempt's start, or say why it starts cold. A server that died
        or imported modules since edited is replaced here, before the start, not in the background:
        its imports would compete for the CPU with the cold workers of the attempt that found it dead."""
        cfg, pool = self.cfg, self.warm
        forced = cfg.workers.warm_fail_attempt == self.attempt
        if pool is None:
            choice = choose_path(
                enabled=cfg.workers.warm, python_program=not cfg.no_python, server_state="none"
            )
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
        self.ledger.emit(
            DecisionTaken(
                ts=self.clock.now(), action=action, reason=f"{group.path}: {why}", **self.ledger.ctx()
            )
        )

    def _supervise(
        self, group: WorkerGroup, receiver, block, specs: list[WorkerSpec], board=None
    ) -> AttemptOutcome:
        """One attempt's supervision: the monitors decide, the supervisor acts (launch/attempt/supervisor.py)."""
        files = AttemptFiles(
            self.run_dir,
            self.cfg.node_name,
            self.attempt,
            self.clock,
            group,
            specs,
            self.cfg.workers.stop_grace_s,
        )
        world = specs[0].env.get("WORLD_SIZE", "") if specs else ""
        prior = self.step_times.get(world, ()) if group.path is StartPath.WARM else ()  # cold: warm-up
        sup = Supervisor(
            cfg=self.cfg,
            ledger=self.ledger,
            console=self.console,
            files=files,
            job=self,
            chaos=self.chaos,
            group=group,
            receiver=receiver,
            block=block,
            specs=specs,
            clock=self.clock,
            attempt=self.attempt,
            node=self.cfg.node_name,
            world=self.world,
            straggler_gate=self._straggler_gate(),
            board=board,
            link=LinkSampler(lambda: [group.pid(s.global_rank) for s in specs], clock=self.clock.now)
            if self.cfg.hang.slow_link_kbit and self._across_hosts()
            else None,
            prior_step_times=prior,
        )
        if self.joining:  # a spare's (or a newcomer's) ranks start in the generation they join
            sup.in_place.start_joining(self.joining, self.clock.now(), newcomer=self.newcomer)
        out = sup.run()
        self.step_times = {world: tuple(sup.tracker.step_times)}
        return out

    def _across_hosts(self) -> bool:
        """Whether this attempt's group spans other nodes: only then can a link between hosts be slow,
        and only then are the link counters sampled (``ss`` and ``tc`` every second cost a busy host)."""
        return self.world is not None and len(self.world.active) > 1

    def _straggler_gate(self):
        """Whether this attempt may act on the straggler policy's verdicts: the mode, and the detector's
        precision measured over the history before this attempt (read only when not observe-only)."""

        cfg = self.cfg
        stats, cannot_leave = None, ""
        if cfg.straggler.action != "observe" and self.rendezvous is not None and self.rendezvous.elastic:
            port = int(cfg.rendezvous.endpoint.rpartition(":")[2])
            if listens_on(port):
                cannot_leave = (
                    f"this agent hosts the c10d rendezvous store ({cfg.rendezvous.endpoint}): leaving would end "
                    "the job for every node"
                )
        if cfg.straggler.action != "observe":
            stats, unread = straggler_precision(
                self.run_dir.root, cfg.straggler.history, cfg.run_id, self.attempt
            )
            for why in unread[:3]:
                self.console.note(f"straggler precision: history not read: {why}")
        return straggler_gate(
            cfg.straggler.action,
            stats,
            min_precision=cfg.straggler.act_min_precision,
            min_firings=cfg.straggler.act_min_firings,
            cannot_leave=cannot_leave,
        )

    # --- the node's health -----------------------------------------------------------------------------

    def _route_around(self) -> dict[str, str]:
        """The NCCL environment changes this node's workers start with once a sick link of the node
        was routed around (decided by the live collector, asked for one more round here so a failure
        just detected counts for this very start). A new change is recorded as a decision and flags
        the node for repair: it stays in the job, suspect, until re-validated."""

        if self.diagnosis is None:
            return {}
        if self.attempt > 0:  # the first start has no failure to diagnose yet
            self.diagnosis.refresh()
        route = self.diagnosis.route_env()
        if route != self.routed:
            change = " ".join(f"{k}={v}" for k, v in sorted(route.items()))
            state = self._flag_node(
                CheckOutcome(
                    status=CheckStatus.WARN,
                    reason=f"repair: a sick link routed around ({change})",
                    fault_key="link",
                )
            )
            self.ledger.emit(
                DecisionTaken(
                    ts=self.clock.now(),
                    action="route_around_hca",
                    reason=f"{self.cfg.node_name}'s workers start with {change}, leaving the sick link out; "
                    f"node flagged for repair: {state}",
                    **self.ledger.ctx(),
                )
            )
            self.routed = route
        return route

    def _flag_node(self, outcome) -> str:
        try:
            return record_outcome(
                self.cfg.node_name,
                outcome,
                now=self.clock.now(),
                state_dir=self.cfg.health.state_dir or self.run_dir.root / "health",
                backend=self.cfg.health.backend,
            )
        except (StalwartError, OSError) as exc:  # the job goes on; the decision says the flag did not stick
            return f"not recorded ({getattr(exc, 'message', None) or exc})"

    # --- JobLink: what the supervisor asks of the job --------------------------------------------------

    def signal(self) -> int | None:
        return self._signal()

    def nodes_waiting(self) -> int | None:
        return self.rendezvous.nodes_waiting() if self.rendezvous is not None else None

    def release_spares(self) -> None:
        """Tell hot spares the job is done (they poll every 0.5 s; keep the store up that long)."""
        if self.rendezvous is None or self.rendezvous.store is None:
            return
        if self.world is None or not self.world.spares or self.group_rank != 0:
            return
        try:
            self.rendezvous.announce_done()
            self.clock.sleep(1.5)
        except Exception:  # noqa: BLE001 - best effort: spares also leave when the store goes away
            pass

    def quarantine(self, node: str, reason: str, fault: str = "straggler", recoverable: bool = True) -> str:
        where = self.cfg.health.state_dir or self.run_dir.root / "health"
        now, backend = self.clock.now(), self.cfg.health.backend
        return quarantine_node(node, reason, fault, recoverable, now=now, state_dir=where, backend=backend)

    def hosted_stores(self) -> str:
        return "the rendezvous store" if self.rendezvous is not None and self.rendezvous.hosting else ""
