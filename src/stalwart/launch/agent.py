"""The node agent behind ``stalwart run``: one per node, composed of a job policy and its ports.

Agents meet through torch.distributed.elastic's c10d rendezvous (as torchrun does; launch/rendezvous/node_rendezvous.py).
The job policy (policy/job.py) decides what happens after each round and attempt; the runner
(launch/runner.py) carries its decisions out over the ports (launch/ports.py): the rendezvous, this
node's workers (launch/attempt/node_workers.py, each attempt watched by the supervisor and its monitors),
the run files (launch/failure_files.py), the ledger sink (launch/ledger_sink.py) and agent-side chaos
(launch/agent_chaos.py). This module builds them for a run configuration, installs the signal
handlers, starts what the job needs (node memory tier, live diagnosis, fork server) and stops it all
on the way out. Time comes from an injected clock (launch/clock.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from typing_extensions import assert_never

from .. import job_key
from ..chaos.plan import FaultPlan, build_plan
from ..checkpoint.tiers import TierKind
from ..diagnose.live import LiveDiagnosis
from ..errors import CheckpointError, ConfigError, FaultPlanError, LedgerError
from ..events import Event, JobStarted
from ..events.node_health import HealthChecked
from ..events.startup import StartupMarks
from ..exit_codes import EXIT_BAD_INPUT, EXIT_INFRA, EXIT_OK
from ..ledger import LedgerWriter, read_available, read_merged
from ..policy import job
from ..policy.checkpoint_scrub import Budget
from ..policy.job import End
from ..protocol import WorkerEnv
from ..protocol.run_dir import DISK_TIER, MEMORY_TIER, RunDir
from ..settings.run_config import CONFIG_SETTINGS, RunConfig
from .agent_chaos import AgentChaos
from .attempt.node_workers import NodeWorkers
from .checkpoint_scrub import CheckpointScrub, ScrubTier
from .clock import Clock, SystemClock
from .failure_files import CheckpointFiles
from .finished_run import last_step
from .ledger_sink import NodeLedger
from .node_gate import check_node
from .ports import Progress, Stepped
from .processes.warm_pool import WarmPool
from .processes.worker_group import WorkerSpec
from .rendezvous.arrival import FinishedMark
from .rendezvous.node_rendezvous import NodeRendezvous, local_addr
from .runner import JobRunner, write_verdict

if TYPE_CHECKING:
    from ..checkpoint.node_memory import NodeMemory
    from ..diagnose.live import LiveDiagnosis


class _Console:
    def __init__(self, note: Callable[[str], None], progress: Progress, stepped: Stepped) -> None:
        self.note, self.progress, self.stepped = note, progress, stepped


def _no_progress(step: int, total: int, attempt: int, rate: float, *, now: float | None = None) -> None:
    return None


class NodeHealthGate:
    """Implements :class:`stalwart.launch.ports.HealthGate`: the node's health checks before a start.
    Every check is also recorded in the run's own ledger (``HealthChecked``), so the run's readers
    (report, ``/metrics``, dashboard) tell a node that passed its gate from one never checked."""

    def __init__(
        self, cfg: RunConfig, clock: Clock, run_root: Path, ledger: NodeLedger | None = None
    ) -> None:
        self.cfg, self.clock, self.run_root, self.ledger = cfg, clock, run_root, ledger

    def check(self, attempt: int) -> tuple[str, str]:
        cfg = self.cfg
        if not cfg.health.gate:
            return "", ""

        now = self.clock.now()
        res = check_node(
            node=cfg.node_name,
            now=now,
            state_dir=cfg.health.state_dir or self.run_root / "health",
            fixture=cfg.health.fixture,
            active=cfg.health.active and attempt > 0,
            backend=cfg.health.backend,
        )
        if self.ledger is not None:
            checked = HealthChecked(
                **self.ledger.ctx(),
                ts=now,
                level=res.level,
                status=res.status,
                action=res.action,
                reason=res.reason,
                duration_s=res.duration_s,
            )
            self.ledger.emit(checked, show=False)
        return ("", "") if res.passed else (res.reason, res.state)


def job_spec(cfg: RunConfig) -> job.JobSpec:
    return job.JobSpec(
        node=cfg.node_name,
        nproc_per_node=cfg.nproc_per_node,
        min_nodes=cfg.min_nodes,
        max_nodes=cfg.max_nodes,
        size_rule=cfg.size_rule,
        budget=cfg.budget,
    )


@dataclass
class _Started:
    """What the agent started for the job, each stopped once: before the verdict when the policy
    ends the job (:meth:`JobRunner.finish`), else on the way out."""

    diagnosis: LiveDiagnosis | None = None
    memory: NodeMemory | None = None
    scrub: CheckpointScrub | None = None
    warm: WarmPool | None = None
    rendezvous: NodeRendezvous | None = None

    def close(self, *, leaving: bool) -> None:
        """Each stop runs even when an earlier one raised: the diagnosis first (its last round may
        raise incidents), then the rendezvous, the checkpoint verification, the memory tier (whose
        directory it reads), the fork server."""
        diagnosis, rendezvous, memory, warm = self.diagnosis, self.rendezvous, self.memory, self.warm
        scrub = self.scrub
        self.diagnosis = self.rendezvous = self.memory = self.warm = self.scrub = None
        with ExitStack() as stops:  # last pushed, first run
            if warm is not None:
                stops.callback(warm.close)
            if memory is not None:
                stops.callback(memory.close)
            if scrub is not None:
                stops.callback(scrub.stop)
            if rendezvous is not None:
                stops.callback(rendezvous.close, leaving=leaving)
            if diagnosis is not None:
                stops.callback(diagnosis.stop)


class Agent:
    def __init__(
        self,
        cfg: RunConfig,
        *,
        notify: Callable[[Event], None] | None = None,
        progress: Progress | None = None,
        started: float | None = None,
        note: Callable[[str], None] | None = None,
        clock: Clock | None = None,
        stepped: Stepped | None = None,
    ):
        self.cfg = cfg
        if cfg.run_dir is None:
            raise ConfigError("the agent needs a run directory", "resolve the configuration first")
        self.run = RunDir(cfg.run_dir).create()
        self.clock: Clock = clock or SystemClock()
        self.started = started or self.clock.now()
        self.run.archive_errors(cfg.node_name, f"{int(self.started)}-{os.getpid()}")
        self.plan: FaultPlan = build_plan(cfg.faults.specs, cfg.faults.file or None)
        self.key = job_key.resolve(
            key_file=cfg.trust.key_file, insecure=cfg.trust.insecure, multi_node=cfg.max_nodes > 1
        )
        self._notify = notify or (lambda ev: None)
        self.console = _Console(
            note or (lambda text: None),
            progress or _no_progress,
            stepped or (lambda attempt, steps, ranks: None),
        )
        self.ledger = NodeLedger(
            LedgerWriter(self.run.agent_ledger(cfg.node_name, os.getpid()), writer=f"agent {cfg.node_name}"),
            run_id=cfg.run_id,
            node=cfg.node_name,
            notify=self._notify,
            note=self.console.note,
        )
        self.received: int | None = None  # the signal this agent received
        self.runner: JobRunner | None = None
        self.chaos: AgentChaos | None = None
        self.workers: NodeWorkers | None = None

    @property
    def attempt(self) -> int:
        return self.ledger.attempt

    def _on_signal(self, signum: int, frame: object) -> None:
        self.received = signum

    def _signal(self) -> int | None:
        return self.received

    def run_job(self) -> int:
        cfg = self.cfg
        imported = self.clock.now()  # the interpreter, Stalwart's imports and the settings are behind
        self.ledger.emit(
            JobStarted(
                ts=self.started,
                script=cfg.script,
                args=tuple(cfg.script_args),
                nproc_per_node=cfg.nproc_per_node,
                min_nodes=cfg.min_nodes,
                max_nodes=cfg.max_nodes,
                max_restarts=cfg.restart.max_restarts,
                config=cfg.model_dump(mode="json"),
                **self.ledger.ctx(),
            )
        )
        handled = {signal.SIGTERM, signal.SIGUSR1, signal.SIGINT}
        handled |= {getattr(signal, n.strip()) for n in cfg.workers.signals_to_handle.split(",") if n.strip()}
        handled -= {signal.SIGKILL, signal.SIGSTOP, signal.SIGUSR2, signal.SIGCHLD}
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        held = _Started()
        try:  # everything started for the job is inside: the finally stops whatever did start
            self._say_key()
            done = NodeRendezvous(cfg, None, self.clock, key=self.key).finished_elsewhere()
            if done is not None:  # arrived after the job succeeded (etcd keeps its mark)
                text = done.message(cfg.run_id)
                self.console.note(text)
                return write_verdict(self.ledger, self.clock, "succeeded", text, EXIT_OK)
            held.memory = memory = self._node_memory()
            held.scrub = self._start_scrub(memory)
            held.diagnosis = diagnosis = self._start_diagnosis()
            held.warm = warm = self._warm_pool()
            held.rendezvous = rendezvous = NodeRendezvous(
                cfg, memory, self.clock, key=self.key, note=self.console.note
            )
            up = self.clock.now()
            self.ledger.emit(StartupMarks(ts=up, imported=imported, services=up, **self.ledger.ctx()))

            def closing(end: End) -> None:
                self._account_chaos()
                if end.outcome == "succeeded":
                    rendezvous.leave_finished_mark(self._finished_mark())
                try:
                    held.close(leaving=end.left)
                except Exception as exc:  # noqa: BLE001 - the policy's verdict is written whatever this did
                    self.console.note(f"stopping the job's services failed: {type(exc).__name__}: {exc}")

            self.runner = self._runner(rendezvous, memory, diagnosis, warm, closing)
            code = self.runner.run()
            self._say_missing()
            return code
        except FaultPlanError as exc:  # a plan the script cannot take, found once its workers ran
            self._end("aborted", f"refused: {exc}", EXIT_BAD_INPUT)
            raise
        except BaseException as exc:
            # an agent bug or an unexpected stop still leaves a verdict in the ledger
            self._end("agent_error", f"agent error: {type(exc).__name__}: {exc}", EXIT_INFRA)
            raise
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            try:
                ended = self.runner.ended if self.runner is not None else None
                held.close(leaving=ended is not None and ended.left)
            finally:
                self.ledger.close()

    def _runner(
        self,
        rendezvous: NodeRendezvous,
        memory,
        diagnosis,
        warm: WarmPool | None,
        closing: Callable[[End], None],
    ) -> JobRunner:
        self.workers = workers = self._node_workers(
            rendezvous=rendezvous, memory=memory, diagnosis=diagnosis, warm=warm
        )
        self.chaos = workers.chaos

        def on_attempt(attempt: int) -> None:
            self.ledger.attempt = attempt

        return JobRunner(
            state=job.initial(job_spec(self.cfg)),
            rendezvous=rendezvous,
            workers=workers,
            files=CheckpointFiles(self.run, node=self.cfg.node_name, since=self.started),
            ledger=self.ledger,
            clock=self.clock,
            signal=self._signal,
            gate=NodeHealthGate(self.cfg, self.clock, self.run.root, self.ledger),
            on_attempt=on_attempt,
            closing=closing,
        )

    def _end(self, outcome: str, verdict: str, code: int) -> int:
        """End the job with a verdict outside the policy (an agent error)."""
        write_verdict(self.ledger, self.clock, outcome, verdict, code)
        self._say_missing()
        return code

    def _finished_mark(self):
        """The final step and the end of a job that succeeded, for agents that arrive later. Left
        before the verdict is written (the verdict is the ledger's last event), so the step comes
        from the steps themselves, not from a verdict on disk."""

        try:
            step = last_step(read_merged(self.run.root))
        except LedgerError:
            step = -1
        return FinishedMark(step, self.clock.now())

    def _account_chaos(self) -> None:
        """Before the verdict: say which planned faults never fired (the report shows them too)."""
        if self.chaos is None or not self.plan.faults:
            return

        try:  # a damaged ledger file is skipped, not a reason to say nothing
            line = self.chaos.account(read_available(self.run.root).events)
        except LedgerError as exc:
            line = f"chaos: which planned faults fired is unknown: {exc}"
        if line:
            self.console.note(line)

    def _say_missing(self) -> None:
        if self.ledger.missing:
            self.console.note(
                f"the ledger is missing {self.ledger.missing} event(s), this verdict "
                f"included: {self.run.ledger} stayed full; the report will not show them"
            )

    def _warm_pool(self) -> WarmPool | None:
        cfg = self.cfg
        if not cfg.workers.warm or cfg.no_python:
            return None
        pool = WarmPool(
            python=cfg.python,
            script=cfg.script,
            module=cfg.module,
            script_args=list(cfg.script_args),
            env=WorkerEnv.strip(os.environ, set(CONFIG_SETTINGS)),
            cwd=os.getcwd(),
            label=f"stalwart-fork-server run_dir={self.run.root}",
            instrument=cfg.workers.instrument,
        )
        pool.launch()  # its imports overlap with the rendezvous
        return pool

    def _node_memory(self):
        """The node's memory tier directory and (several nodes meeting by c10d) its peer store."""
        from ..checkpoint.node_memory import NodeMemory  # deferred: heavy (aiohttp)

        cfg = self.cfg
        host = (
            (cfg.rendezvous.local_addr or local_addr(cfg.rendezvous.endpoint))
            if cfg.use_c10d and cfg.max_nodes > 1
            else None
        )
        try:
            memory = NodeMemory(
                run_id=cfg.run_id,
                node=cfg.node_name,
                host=host,
                secret=self.key.peer_secret(cfg.rendezvous.id or cfg.run_id) if host is not None else None,
            )
        except (OSError, CheckpointError) as exc:  # no tmpfs, or not ours: the job runs from disk
            self.console.note(f"no node memory tier ({exc}); checkpoints restore from disk only")
            return None
        if memory.notice:  # a planted directory avoided; several nodes without a key: no peer replication
            self.console.note(memory.notice)
        return memory

    def _say_key(self) -> None:
        """Say where the job key came from when the user should know (a key made now, none at all)."""
        key = self.key
        match key.source:
            case job_key.KeySource.INSECURE:
                self.console.note(job_key.insecure_warning(self.cfg.node_name))
            case job_key.KeySource.MADE_DEFAULT_FILE:
                self.console.note(
                    f"made the job key {key.where} (0600): every node of this job must read the same "
                    "key, which a shared home gives; elsewhere copy it to each node or set "
                    f"{job_key.KEY_FILE_ENV}"
                )
            case (
                job_key.KeySource.FILE
                | job_key.KeySource.ENV
                | job_key.KeySource.DEFAULT_FILE
                | job_key.KeySource.RUN
            ):
                pass
            case _ as unreachable:
                assert_never(unreachable)

    def _start_scrub(self, memory: NodeMemory | None) -> CheckpointScrub | None:
        """Background verification of the committed checkpoints (launch/checkpoint_scrub.py): the run
        directory's tier by the node of group rank 0 (the nodes of a job share the run directory), the
        node memory tier by every node; None when turned off."""
        duty = self.cfg.checkpoint.scrub_duty
        if not duty:
            return None
        tiers = [ScrubTier(DISK_TIER, self.run.checkpoints, TierKind.LOCAL.speed, verify=self._leads)]
        if memory is not None:
            tiers.append(ScrubTier(MEMORY_TIER, memory.versions_root, TierKind.MEMORY.speed, node_local=True))
        return CheckpointScrub(
            tiers,
            run=self.run,
            node=self.cfg.node_name,
            run_id=self.cfg.run_id,
            notify=self._notify,
            attempt=lambda: self.attempt,
            budget=Budget(duty=duty),
        ).start()

    def _leads(self) -> bool:
        """Whether this node is group rank 0 of the current attempt (before the first: yes)."""
        return self.workers is None or self.workers.group_rank == 0

    def _start_diagnosis(self):
        """The live diagnosis collector (diagnose/live.py) on its own thread; None when turned off."""
        if not self.cfg.diagnosis.interval_s:
            return None

        return LiveDiagnosis(
            self.run,
            self.cfg.node_name,
            self.cfg.run_id,
            self.cfg.diagnosis_sources(),
            notify=self._notify,
            attempt=lambda: self.attempt,
        ).start()

    def _node_workers(
        self,
        rendezvous: NodeRendezvous | None = None,
        memory: NodeMemory | None = None,
        diagnosis: LiveDiagnosis | None = None,
        warm: WarmPool | None = None,
    ) -> NodeWorkers:
        """The node's worker launcher, built only here: with the live parts for the job runner, bare
        (no rendezvous, memory, diagnosis or warm pool) for the specs of one attempt."""
        return NodeWorkers(
            self.cfg,
            run=self.run,
            clock=self.clock,
            ledger=self.ledger,
            console=self.console,
            faults=self.plan,
            chaos=AgentChaos(self.plan, self.run, self.ledger, self.clock, memory),
            rendezvous=rendezvous,
            signal=self._signal,
            memory=memory,
            diagnosis=diagnosis,
            warm=warm,
        )

    def _worker_specs(
        self, group_rank: int, num_nodes: int, addr: str, port: int, receiver, ctl: Path, route=None
    ) -> list[WorkerSpec]:
        """The workers' specs of this node for the current attempt (their environment: torchrun's)."""
        workers = self._node_workers()
        workers.attempt = self.attempt
        return workers.worker_specs(group_rank, num_nodes, addr, port, receiver, ctl, route)


__all__ = ["Agent", "NodeHealthGate", "job_spec"]
