"""Silent data corruption in a Session's loop: data-parallel replicas compare exact fingerprints of
their state (``fingerprint.exact``) every N steps and at every checkpoint save; one that differs is
named by majority (``policy/sdc.py``) and every rank rolls back to the newest checkpoint verified
clean. Every rank tells its own agent what was found (a ``CorruptionFound`` message): the agent of
the node named with confidence quarantines it (``launch/attempt/sdc_quarantine.py``).

The state compared is every parameter of every module in the loop's ``state`` and every tensor of
every optimizer's state, in a fixed order. One check is one pass over that memory and one
``all_gather`` of a small int64 vector per rank: its fingerprints and, last, the number of steps
this rank proposes until the next check (from the check's measured cost, the step time and the
budget); every rank takes the largest proposal, so all agree on when the next collective comes.

The job's own invariant decides whether it applies: the check is on only while the replicas were
seen identical at the loop's start and again after its first step (a job whose ranks train
different models, or shard them, differs there and the check turns itself off with a note). A
checkpoint is *verified clean* when the replicas agreed at its save (or at its load, at the loop's
start): only those are rollback targets, so a checkpoint saved after a corruption never is.

Localisation by replay: a mismatch that names no replica (two replicas, or no majority) is
remembered with every replica's fingerprints and nodes across the rollback it causes. The rollback
re-computes the same steps; when the replay completes that step again the check runs there (due
whatever the interval) and ``policy.sdc.replayed`` judges each replica's new fingerprint against its
first: a second ``SilentCorruption`` (verdict ``replayed``) names the corrupted replica when the
evidence does, and every rank tells its agent, which quarantines a node named with confidence. A
replay that ends before its step (the loop stops, re-forms or halts) is recorded as not reached.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import SilentCorruptionError
from ..events import Event, IncidentRaised
from ..events.integrity import SilentCorruption
from ..policy.sdc import (
    MAX_INTERVAL,
    Localisation,
    ReplayFinding,
    ReplicaVerdict,
    SdcAction,
    SdcDecision,
    check_interval,
    decide,
    replayed,
)
from ..protocol import DEFAULT_SDC_BUDGET, CorruptionFound, Message, Note, WorkerEnv
from ..protocol.json_collective import all_gather_json, device_for
from .clock import Clock
from .fingerprint import exact
from .shard_replicas import local, localise_groups, replicas_of

if TYPE_CHECKING:
    from .session import Session

SHOWN = 4  # differing tensors named in an event


@dataclass(frozen=True)
class Replay:
    """A mismatch that named no replica, kept across its rollback until the replay completes its step."""

    rows: tuple[tuple[int, ...], ...]  # every replica's fingerprints when it was found
    nodes: tuple[str, ...]  # every replica's node then
    from_step: int  # the checkpoint the replay starts from
    group: tuple[int, ...] = ()  # the replica group (global ranks) the replay judges; () every rank


class ParamsOf:
    """An optimizer's parameters, as state to compare (an unchanged script's hooks see no module)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.params = [p for g in optimizer.param_groups for p in g["params"] if isinstance(p, torch.Tensor)]


def state_tensors(state: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:  # Any: user state
    """The tensors replicas must hold identically: modules' parameters, optimizers' state tensors
    (in parameter order), named by their place in ``state``."""
    out: list[tuple[str, torch.Tensor]] = []
    for key, obj in state.items():
        if isinstance(obj, ParamsOf):
            out += [(f"{key}[{i}]", p) for i, p in enumerate(obj.params)]
        elif isinstance(obj, torch.nn.Module):
            out += [(f"{key}.{name}", p) for name, p in obj.named_parameters()]
        elif isinstance(obj, torch.optim.Optimizer):
            index = 0
            for group in obj.param_groups:
                for p in group["params"]:
                    for k, v in sorted(obj.state.get(p, {}).items()):
                        if isinstance(v, torch.Tensor):
                            out.append((f"{key}.state[{index}].{k}", v))
                    index += 1
    return out


def gather_prints(vec: torch.Tensor) -> list[list[int]]:
    """Every rank's int64 vector (collective over the default group; equal lengths on every rank)."""
    v = vec.to(device_for(str(dist.get_backend())))
    out = [torch.empty_like(v) for _ in range(dist.get_world_size())]
    dist.all_gather(out, v)
    return [[int(x) for x in o.cpu().tolist()] for o in out]


def in_group() -> bool:
    """A default process group of two ranks or more: replicas to compare."""
    return dist.is_initialized() and dist.get_world_size() >= 2


def gather_nodes(node: str) -> list[str]:
    """Every rank's node name (collective; JSON, never pickles)."""
    return [str(n) for n in all_gather_json(node)]


class ReplicaCheck:
    """One Session's cross-replica checks (kept across its loops: the clean marks outlive a re-formation)."""

    def __init__(
        self,
        *,
        every: int,
        budget: float,
        rank: int,
        node: str,
        clock: Clock,
        emit: Callable[[Event], None],
        note: Callable[[str], None],
        context: Callable[[], dict[str, Any]],  # Any: an event's context is JSON
        gather: Callable[[torch.Tensor], list[list[int]]] = gather_prints,
        nodes: Callable[[str], list[str]] = gather_nodes,
        tell: Callable[[CorruptionFound], None] = lambda msg: None,
    ) -> None:
        self._gather, self._nodes = gather, nodes  # the collectives (a test passes its own)
        self._tell = tell  # this rank's agent: it quarantines its node when the finding names it
        self._every, self._budget = every, budget
        self._rank, self._node, self._clock = rank, node, clock
        self._emit, self._note, self._context = emit, note, context
        self._state: Mapping[str, Any] = {}  # Any: user state
        self._groups: tuple[tuple[int, ...], ...] = ()  # the replica groups (global ranks)
        self.active = False
        self._proven = False  # the replicas were seen identical after a step
        self.clean_steps: list[int] = []
        self.rollbacks = 0
        self.replays: dict[int, Replay] = {}  # step -> the mismatch found there, until replayed
        self.interval = 1  # steps until the next check (every rank's largest proposal)
        self.gap = 0  # steps between the previous check and the latest one: the interval it ran at
        self._next_at = 0
        self._check_s = 0.0
        self._t_last, self._step_last, self._last_clean = 0.0, -1, -1

    @classmethod
    def of_worker(
        cls,
        wenv: WorkerEnv | None,
        rank: int,
        node: str,
        clock: Clock,
        emit: Callable[[Event], None],
        send: Callable[[Message], None],
        context: Callable[[], dict[str, Any]],  # Any: an event's context is JSON
    ) -> ReplicaCheck:
        """A Session's check, as the agent configured it (``send``: this rank's pipe to its agent)."""
        return cls(
            every=wenv.sdc_every if wenv else 0,
            budget=wenv.sdc_budget if wenv else DEFAULT_SDC_BUDGET,
            rank=rank,
            node=node,
            clock=clock,
            emit=emit,
            note=lambda text: send(Note(rank, text, clock.now())),
            context=context,
            tell=send,
        )

    def begin(self, state: Mapping[str, Any], start: int, *, resumed: bool) -> None:  # Any: user state
        """Collective (in a group of two or more ranks), at a loop's start: whether the check applies
        to this job, from its own state."""
        if self.replays:  # a new loop (a re-formed group, other ranks): the replays are not comparable
            self.end(start)
        self._state, self.active, self._proven = state, False, False
        if self._every < 0:
            return
        named = state_tensors(state)
        if not named:
            return
        shapes = self._gather(
            torch.tensor([len(named), sum(local(t).numel() for _, t in named)], dtype=torch.int64)
        )
        found = replicas_of([t for _, t in named], len(shapes))
        if found.off:
            if self._rank == 0:
                self._note(f"silent-data-corruption checks off: {found.off}")
            return
        self._groups = found.groups
        # other tensors on other ranks (of a shard): no replicas, and no equal-length gather to make
        if len({r[0] for r in shapes}) > 1 or any(
            len({tuple(shapes[r]) for r in g}) > 1 for g in self._groups
        ):
            if self._rank == 0:
                self._note(
                    "silent-data-corruption checks off: the ranks hold different tensors (not replicas)"
                )
            return
        rows, _ = self._compare(start)
        if not localise_groups(rows, self._groups)[0].clean:
            if self._rank == 0:
                self._note(
                    "silent-data-corruption checks off: the ranks' state differs at the start (not replicas)"
                )
            return
        self.active = True
        self._last_clean = start
        if resumed and start not in self.clean_steps:
            self.clean_steps.append(start)
        self._next_at = start + 1  # the first step proves the ranks are replicas

    def due(self, completed: int, saving: bool) -> bool:
        return self.active and (saving or completed >= self._next_at or completed in self.replays)

    def _compare(self, completed: int) -> tuple[list[list[int]], list[str]]:
        """Collective: every rank's fingerprints, and the tensors' names; sets the next check."""
        t0 = self._clock.monotonic()
        named = state_tensors(self._state)
        vec = exact([local(t) for _, t in named])
        steps = completed - self._step_last
        self.gap = steps if self._step_last >= 0 else 0
        step_s = (t0 - self._t_last) / steps if self._step_last >= 0 and steps > 0 else 0.0
        proposal = self._every or check_interval(self._check_s, step_s, self._budget)
        rows = self._gather(torch.cat([vec.to(torch.int64), torch.tensor([proposal], device=vec.device)]))
        self.interval = max(1, min(MAX_INTERVAL, max(r[-1] for r in rows)))
        self._next_at = completed + self.interval
        t1 = self._clock.monotonic()
        self._check_s = t1 - t0 if self._check_s == 0 else 0.8 * self._check_s + 0.2 * (t1 - t0)
        self._t_last, self._step_last = t1, completed
        return [r[:-1] for r in rows], [n for n, _ in named]

    def verify(self, completed: int, saving: bool) -> int:
        """Collective: compare the replicas after ``completed`` steps. Returns -1 to go on, or the
        step of the clean checkpoint every rank must roll back to; raises SilentCorruptionError when
        the run must stop. A save about to follow a clean check is marked verified clean."""
        rows, names = self._compare(completed)
        found, group = localise_groups(rows, self._groups)
        if not self._proven:
            self._proven = True
            if not found.clean:  # the ranks diverge by themselves: not data-parallel replicas
                self.active = False
                if self._rank == 0:
                    self._note(
                        "silent-data-corruption checks off: the ranks' state differs after a step (not replicas)"
                    )
                return -1
        replay = self.replays.pop(completed, None)
        if found.clean:
            if replay is not None:
                self._replayed(completed, replay, rows, names, SdcAction.CONTINUE)
            self._last_clean = completed
            if saving and completed not in self.clean_steps:
                self.clean_steps.append(completed)
            return -1
        decision = decide(found, step=completed, clean_steps=self.clean_steps, rollbacks=self.rollbacks)
        if replay is not None:
            self._replayed(completed, replay, rows, names, decision.action)
        nodes = self._report(completed, found, decision, rows, names)
        match decision.action:
            case SdcAction.ROLLBACK:
                if not found.suspects:  # nobody named: the replay of this step may name one
                    self.replays[completed] = Replay(tuple(map(tuple, rows)), nodes, decision.to_step, group)
                self.rollbacks += 1
                self._next_at = decision.to_step + self.interval
                self._step_last, self._t_last = decision.to_step, self._clock.monotonic()
                return decision.to_step
            case SdcAction.HALT:
                self.end(completed)
                raise SilentCorruptionError(decision.reason, "drain the suspect node and requeue the job")
            case SdcAction.CONTINUE:  # the policy continues only replicas that agree
                return -1

    def end(self, completed: int) -> None:
        """The loop stops, re-forms or halts after ``completed`` steps: each replay still pending is
        recorded as not reached (by rank 0; no collective, and nobody is named)."""
        names = [n for n, _ in state_tensors(self._state)]
        for step, replay in sorted(self.replays.items()):
            found = self._judge(replay, None, step, completed)
            self._record_replay(step, replay, found, [], names, "")
        self.replays.clear()

    @staticmethod
    def _judge(replay: Replay, rows: list[list[int]] | None, step: int, reached: int) -> ReplayFinding:
        """``policy.sdc.replayed`` within the replica group that disagreed, naming global ranks."""
        group = replay.group or tuple(range(len(replay.rows)))
        again = [rows[r] for r in group] if rows is not None else None
        found = replayed([replay.rows[r] for r in group], again, step=step, reached=reached)
        if group == tuple(range(len(replay.rows))):
            return found
        reason = f"replicas of ranks {', '.join(map(str, group))} (by place): {found.reason}"
        return replace(found, suspects=tuple(group[i] for i in found.suspects), reason=reason)

    def _replayed(
        self, completed: int, replay: Replay, rows: list[list[int]], names: list[str], action: SdcAction
    ) -> None:
        """The replay completed the step of a remembered mismatch: judge it; every rank tells its
        agent (the agent of a node named with confidence quarantines it); rank 0 records it."""
        found = self._judge(replay, rows, completed, -1)
        nodes = tuple(replay.nodes[r] for r in found.suspects)
        tensors = tuple(names[t] if t < len(names) else f"#{t}" for t in found.tensors[:SHOWN])
        verdict = ReplicaVerdict.REPLAYED.value
        now = self._clock.now()
        self._tell(
            CorruptionFound(
                self._rank, completed, verdict, found.suspects, nodes, found.confidence, now, tensors
            )
        )
        self._record_replay(completed, replay, found, rows, names, action.value)

    def _record_replay(
        self,
        step: int,
        replay: Replay,
        found: ReplayFinding,
        again: list[list[int]],
        names: list[str],
        action: str,
    ) -> None:
        """Rank 0 writes what the replay of ``step`` found (a ``SilentCorruption``, verdict
        ``replayed``), an incident when it names a replica, and a console line."""
        if self._rank != 0:
            return
        shown = found.tensors[:SHOWN]
        tensors = tuple(names[t] if t < len(names) else f"#{t}" for t in shown)
        evidence = tuple(
            f"{tensors[i]}: first "
            + ", ".join(f"rank {r}={row[t]}" for r, row in enumerate(replay.rows))
            + ("; replay " + ", ".join(f"rank {r}={row[t]}" for r, row in enumerate(again)) if again else "")
            for i, t in enumerate(shown)
        )
        nodes = tuple(replay.nodes[r] for r in found.suspects)
        now, ctx = self._clock.now(), self._context()
        why = f"silent data corruption, localised by replay: {found.reason}"
        self._emit(
            SilentCorruption(
                ts=now,
                step=step,
                verdict=ReplicaVerdict.REPLAYED.value,
                replay=found.outcome.value,
                suspect_ranks=found.suspects,
                suspect_nodes=nodes,
                confidence=found.confidence,
                action=action,
                to_step=replay.from_step,
                interval=self.gap if again else 0,
                last_clean_step=self._last_clean,
                tensors=tensors,
                evidence=evidence,
                reason=why,
                **ctx,
            )
        )
        if found.suspects:
            who = ", ".join(f"rank {r} on {n}" for r, n in zip(found.suspects, nodes, strict=True))
            self._emit(
                IncidentRaised(
                    ts=now,
                    cause=f"silent data corruption in {who}, named by replaying step {step}",
                    fault_class="hardware",
                    component="gpu",
                    confidence=found.confidence,
                    action=f"drain {', '.join(sorted(set(nodes)))}",
                    action_taken=False,  # the node's own agent quarantines it (policy.sdc.quarantine)
                    rule="sdc:replay",
                    onset=now,
                    evidence=(why, *evidence),
                    nodes=nodes,
                    ranks=found.suspects,
                    **ctx,
                )
            )
        self._note(why)

    def _report(
        self,
        completed: int,
        found: Localisation,
        d: SdcDecision,
        rows: list[list[int]],
        names: list[str],
    ) -> tuple[str, ...]:
        """Every rank names its node (collective) and tells its agent what was found; rank 0 writes
        the event, the incident and a console line. Returns every rank's node."""
        nodes = tuple(self._nodes(self._node))
        shown = found.tensors[:SHOWN]
        tensors = tuple(names[t] if t < len(names) else f"#{t}" for t in shown)
        suspect_nodes = tuple(nodes[r] for r in d.suspects)
        now = self._clock.now()
        self._tell(
            CorruptionFound(
                self._rank,
                completed,
                found.verdict.value,
                d.suspects,
                suspect_nodes,
                d.confidence,
                now,
                tensors,
            )
        )
        if self._rank != 0:
            return nodes
        evidence = tuple(
            f"{tensors[i]}: " + ", ".join(f"rank {r}={row[t]}" for r, row in enumerate(rows))
            for i, t in enumerate(shown)
        )
        ctx = self._context()
        self._emit(
            SilentCorruption(
                ts=now,
                step=completed,
                verdict=found.verdict.value,
                suspect_ranks=d.suspects,
                suspect_nodes=suspect_nodes,
                confidence=d.confidence,
                action=d.action.value,
                to_step=d.to_step,
                interval=self.gap,  # the interval this check ran at (the next one may differ)
                last_clean_step=self._last_clean,
                tensors=tensors,
                evidence=evidence,
                reason=d.reason,
                **ctx,
            )
        )
        who = ", ".join(f"rank {r} on {n}" for r, n in zip(d.suspects, suspect_nodes, strict=True))
        self._emit(
            IncidentRaised(
                ts=now,
                cause=f"silent data corruption in {who or 'one of the replicas'}",
                fault_class="hardware",
                component="gpu",
                confidence=d.confidence,
                action=f"{d.action.value}: drain {', '.join(suspect_nodes)}"
                if suspect_nodes
                else d.action.value,
                action_taken=d.action is SdcAction.ROLLBACK,
                rule="sdc:replica-mismatch",
                onset=now,
                evidence=(d.reason, *evidence),
                nodes=suspect_nodes,
                ranks=d.suspects,
                **ctx,
            )
        )
        self._note(d.reason)
        return nodes


def loop_check(s: Session, state: dict[str, Any], start: int) -> ReplicaCheck | None:  # Any: user state
    """Collective at a loop's start: the session's silent-data-corruption check for this loop, or None
    when the job has one rank or the agent turned it off."""
    w = s.worker_env
    if s.world_size < 2 or (w is not None and w.sdc_every < 0) or not in_group():
        return None
    if s._replicas is None:
        s._replicas = ReplicaCheck.of_worker(w, s.rank, s.node, s.clock, s.emit, s._send, s._ctx)
    s._replicas.begin(state, start, resumed=start > 0 and s._ckpt.loaded_step == start)
    return s._replicas
