"""Silent data corruption: which replica holds corrupted state, and what to do about it (pure).

Data-parallel replicas must hold bit-identical state after every step. Each replica reports one
fingerprint per state tensor (``train/fingerprint.py``); :func:`localise` compares them and
:func:`decide` turns what it found into a decision with a reason; :func:`quarantine` says whether
the suspect's node leaves the pool (its agent carries that out). No torch, no store, no clock:
the SDK's ``train/replica_check.py`` gathers the fingerprints and carries out the decision, and the
unit tests drive these functions with plain integers.

How sure localisation is: with three or more replicas and one of them different from a strict
majority, that replica holds the corrupted state (two independent corruptions giving identical
fingerprints do not happen); its node is the likely cause (0.9), not a certain one, since a
corrupted collective can deliver bad data to one receiver. Several replicas differing from a
majority point to a shared cause (0.6). Two replicas that disagree, or no majority at all, name no
replica: every replica rolls back, and the evidence says the pair disagreed.

Localisation by replay (:func:`replayed`): the rollback re-computes the same steps, so when the
replay completes the step of such a mismatch again, each replica's new fingerprint is compared with
its first one. A replica that reproduced its first result is a reference; one whose first result
differs from what the replay agreed on was corrupted; one that gives a different result each time
is faulty. What cannot be told apart is said so: the same mismatch twice (deterministic), no replica
that reproduced itself, or a replay that never reached the step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from typing_extensions import assert_never

from .label import Label
from .vocabulary import NodeState
from .world_size import SizeRule, WorldPlan, needed_by_others, plan_world

ODD_ONE_OUT_CONFIDENCE = 0.9  # one replica differs from a majority of two or more
SEVERAL_CONFIDENCE = 0.6  # more than one replica differs from a majority
PAIR_CONFIDENCE = 0.5  # two replicas disagree: either may be the one
MAX_ROLLBACKS = 3  # corruption found again after this many rollbacks in one run: stop
MAX_INTERVAL = 10_000  # steps between checks at most (a save checks too)
SHOWN_TENSORS = 3  # differing tensors named in a quarantine reason (a Slurm drain reason is one short line)


class ReplicaVerdict(Label):
    """What the comparison of the replicas' fingerprints found."""

    AGREE = "agree"  # every replica holds the same state
    ODD_ONE_OUT = "odd_one_out"  # a strict majority agrees; the others are named
    PAIR = "pair"  # two replicas disagree: which one is corrupted is not known
    SPLIT = "split"  # no strict majority among three or more
    REPLAYED = "replayed"  # the replay of a pair's (or split's) mismatch: see ReplayOutcome


@dataclass(frozen=True)
class Localisation:
    verdict: ReplicaVerdict
    suspects: tuple[int, ...]  # replica indexes (ranks in the replica group); () when none is named
    confidence: float  # that the suspects' nodes caused it (0 when none is named)
    tensors: tuple[int, ...]  # indexes of the state tensors whose fingerprints differ
    reason: str

    @property
    def clean(self) -> bool:
        return self.verdict is ReplicaVerdict.AGREE


def localise(prints: Sequence[Sequence[int]]) -> Localisation:
    """Compare one fingerprint vector per replica (in replica order)."""
    n = len(prints)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prints):
        groups.setdefault(tuple(p), []).append(i)
    if len(groups) <= 1:
        return Localisation(ReplicaVerdict.AGREE, (), 0.0, (), f"all {n} replicas hold identical state")
    majority = max(groups.values(), key=len)
    reference = prints[majority[0]]
    tensors = tuple(
        sorted({t for p in prints for t, (a, b) in enumerate(zip(p, reference, strict=False)) if a != b})
    )
    shown = ", ".join(str(t) for t in tensors[:5]) + (" ..." if len(tensors) > 5 else "")
    where = f"{len(tensors)} state tensor(s) differ (index {shown})"
    if n == 2:
        why = f"the 2 replicas disagree; {where}; which one is corrupted is not known"
        return Localisation(ReplicaVerdict.PAIR, (), PAIR_CONFIDENCE, tensors, why)
    if 2 * len(majority) <= n:
        why = f"no majority among {n} replicas ({len(groups)} different states, largest {len(majority)}); {where}"
        return Localisation(ReplicaVerdict.SPLIT, (), 0.0, tensors, why)
    suspects = tuple(sorted(i for i in range(n) if i not in majority))
    confidence = ODD_ONE_OUT_CONFIDENCE if len(suspects) == 1 else SEVERAL_CONFIDENCE
    named = ", ".join(f"rank {s}" for s in suspects)
    why = f"{named} differ(s) from the {len(majority)} of {n} replicas that agree; {where}"
    return Localisation(ReplicaVerdict.ODD_ONE_OUT, suspects, confidence, tensors, why)


class SdcAction(Label):
    """What every replica does after a check."""

    CONTINUE = "continue"  # the replicas agree
    ROLLBACK = "rollback"  # every replica loads the newest checkpoint verified clean, and goes on
    HALT = "halt"  # stop: nothing clean to return to, or corruption keeps coming back


@dataclass(frozen=True)
class SdcDecision:
    action: SdcAction
    to_step: int  # the checkpoint to roll back to (-1 unless ROLLBACK)
    suspects: tuple[int, ...]
    confidence: float
    reason: str


def decide(
    found: Localisation,
    *,
    step: int,
    clean_steps: Sequence[int],
    rollbacks: int,
    max_rollbacks: int = MAX_ROLLBACKS,
) -> SdcDecision:
    """The response to one check made after ``step`` steps: ``clean_steps`` are the checkpoints
    whose state the replicas were seen to agree on when it was saved (or loaded); ``rollbacks`` the
    rollbacks this run already made for corruption."""
    match found.verdict:
        case ReplicaVerdict.AGREE:
            return SdcDecision(SdcAction.CONTINUE, -1, (), 0.0, found.reason)
        case ReplicaVerdict.ODD_ONE_OUT | ReplicaVerdict.PAIR | ReplicaVerdict.SPLIT:
            pass
        case ReplicaVerdict.REPLAYED:  # not a comparison's verdict (localise never gives it): a
            pass  # finding all the same, so the safe response, a rollback
        case _:
            assert_never(found.verdict)
    what = f"silent data corruption after step {step}: {found.reason}"
    if rollbacks >= max_rollbacks:
        why = f"{what}; found again after {rollbacks} rollback(s): the fault persists, stop and drain the suspect node"
        return SdcDecision(SdcAction.HALT, -1, found.suspects, found.confidence, why)
    target = max((s for s in clean_steps if s <= step), default=-1)
    if target < 0:
        why = f"{what}; no checkpoint was verified clean, so nothing safe to roll back to: stop"
        return SdcDecision(SdcAction.HALT, -1, found.suspects, found.confidence, why)
    why = f"{what}; every replica rolls back to the checkpoint of step {target}, verified clean when saved"
    return SdcDecision(SdcAction.ROLLBACK, target, found.suspects, found.confidence, why)


def check_interval(check_s: float, step_s: float, budget: float) -> int:
    """Steps between checks so that a check costing ``check_s`` spends at most ``budget`` (a
    fraction) of the training time at steps of ``step_s``; 1 at the least, MAX_INTERVAL at most."""
    if budget <= 0 or step_s <= 0:  # no budget, or no step measured yet: checks at saves only
        return MAX_INTERVAL
    if check_s <= 0:
        return 1
    return max(1, min(MAX_INTERVAL, math.ceil(check_s / (budget * step_s))))


class ReplayOutcome(Label):
    """What replaying the steps up to a mismatch that named no replica found at that step."""

    TRANSIENT = "transient"  # they agree now; a replica whose first result differs from it was corrupted
    SPREAD = "spread"  # they agree now, and no first result matches: no replica to name
    INTERMITTENT = "intermittent"  # they differ again; a replica that did not reproduce itself is faulty
    REPEATED = "repeated"  # the same mismatch again, bit for bit: which replica is wrong is not known
    UNSTABLE = "unstable"  # they differ again, and no consistent replica to compare with: none named
    NOT_REACHED = "not_reached"  # the replay stopped before the step: nothing to compare


@dataclass(frozen=True)
class ReplayFinding:
    outcome: ReplayOutcome
    suspects: tuple[int, ...]  # replica indexes; () when none is named
    confidence: float  # that the suspects' nodes caused it (0 when none is named)
    tensors: tuple[int, ...]  # state tensors whose fingerprints differ (in either run)
    reason: str


def _ranks(ix: Sequence[int]) -> str:
    return ("rank " if len(ix) == 1 else "ranks ") + ", ".join(str(i) for i in ix)


def replayed(
    first: Sequence[Sequence[int]], again: Sequence[Sequence[int]] | None, *, step: int, reached: int = -1
) -> ReplayFinding:
    """Judge a replay: ``first`` holds every replica's fingerprints when a mismatch that named no
    replica was found after ``step`` steps, ``again`` theirs when the replay completed that step once
    more (None: it stopped after ``reached`` steps, before it). The replay starts from a checkpoint
    the replicas agreed on and, as the job is deterministic, re-computes the same state: a replica
    that reproduced its first result bit for bit is the reference the others are judged by."""
    runs = (*first, *(again or ()))
    width = min((len(r) for r in runs), default=0)
    tensors = tuple(t for t in range(width) if len({r[t] for r in runs}) > 1)
    if again is None:
        why = (
            f"the replay stopped after step {reached}, before step {step}: nothing to compare, "
            "so which replica was corrupted is not known"
        )
        return ReplayFinding(ReplayOutcome.NOT_REACHED, (), 0.0, tensors, why)
    pairs = list(zip(first, again, strict=True))
    kept = tuple(i for i, (a, b) in enumerate(pairs) if tuple(a) == tuple(b))  # reproduced itself
    others = tuple(i for i in range(len(pairs)) if i not in kept)
    sure = ODD_ONE_OUT_CONFIDENCE if len(others) == 1 else SEVERAL_CONFIDENCE
    at = f"replay at step {step}"
    if len({tuple(r) for r in again}) == 1:  # the replicas agree now
        if not kept:
            why = (
                f"{at}: the replicas agree now, but no replica's first result matches the replay: the "
                "corruption spread (through the gradients' all-reduce) before the check found it, or the "
                "job does not replay bit for bit; the fault did not repeat, which replica it struck is not known"
            )
            return ReplayFinding(ReplayOutcome.SPREAD, (), 0.0, tensors, why)
        why = (
            f"{at} matched {_ranks(kept)}'s first result; {_ranks(others)}'s first result differed: "
            f"{_ranks(others)} corrupted (the fault did not repeat)"
        )
        return ReplayFinding(ReplayOutcome.TRANSIENT, others, sure, tensors, why)
    if not others:
        why = (
            f"{at} reproduced the same mismatch bit for bit: the divergence is deterministic (a device "
            "that computes the same wrong result every time, or ranks that differ by design); which "
            "replica is wrong is not known"
        )
        return ReplayFinding(ReplayOutcome.REPEATED, (), 0.0, tensors, why)
    if not kept or len({tuple(again[i]) for i in kept}) > 1:
        why = (
            f"{at}: the replicas disagree again and "
            + (
                "no replica reproduced its first result"
                if not kept
                else f"{_ranks(kept)} reproduced theirs, which differ"
            )
            + " (a fault that struck again, or a job that does not replay bit for bit): none is named"
        )
        return ReplayFinding(ReplayOutcome.UNSTABLE, (), 0.0, tensors, why)
    why = (
        f"{at}: the replicas disagree again; {_ranks(kept)} reproduced {'its' if len(kept) == 1 else 'their'} "
        f"first result, {_ranks(others)} did not: {_ranks(others)} faulty (a result that changes from run to run)"
    )
    return ReplayFinding(ReplayOutcome.INTERMITTENT, others, sure, tensors, why)


QUARANTINE_CONFIDENCE = ODD_ONE_OUT_CONFIDENCE  # the least confidence that quarantines a suspect node


class SdcNodeAction(Label):
    """What the suspect's node agent does with its node after a finding (the replicas' rollback or
    halt is :class:`SdcAction`, decided by :func:`decide`)."""

    QUARANTINE = (
        "sdc_quarantine"  # the node is named with confidence: out of the pool until a human clears it
    )
    KEEP = "keep"  # no node can be blamed with confidence: nobody is quarantined


@dataclass(frozen=True)
class NodeQuarantine:
    action: SdcNodeAction
    node: str  # the node to quarantine ("" unless QUARANTINE)
    reason: str


def quarantine(
    verdict: ReplicaVerdict,
    suspect_ranks: Sequence[int],
    suspect_nodes: Sequence[str],
    confidence: float,
    *,
    step: int,
    tensors: Sequence[str] = (),
    min_confidence: float = QUARANTINE_CONFIDENCE,
) -> NodeQuarantine:
    """Whether a finding made after ``step`` steps blames one node with enough confidence to take it
    out of the pool. Only a single replica that differs from a strict majority (odd one out), or that
    a replay named (replayed), does: a pair that disagrees or a split names no replica, and several
    replicas that differ point to a shared cause (a collective, the input) more than to one node."""
    match verdict:
        case ReplicaVerdict.AGREE:
            return NodeQuarantine(SdcNodeAction.KEEP, "", "the replicas agree: nothing to quarantine")
        case ReplicaVerdict.PAIR | ReplicaVerdict.SPLIT:
            why = f"{verdict.value} verdict after step {step}: which replica is corrupted is not known, so no node is quarantined"
            return NodeQuarantine(SdcNodeAction.KEEP, "", why)
        case ReplicaVerdict.ODD_ONE_OUT:
            how = "differs from the majority of replicas"
        case ReplicaVerdict.REPLAYED:
            how = "was named by replaying the step"
        case _:
            assert_never(verdict)
    nodes = sorted({n for n in suspect_nodes if n})
    if not suspect_ranks:
        why = f"{verdict.value} after step {step} names no replica, so no node is quarantined"
        return NodeQuarantine(SdcNodeAction.KEEP, "", why)
    if len(suspect_ranks) != 1 or len(nodes) != 1:
        named = ", ".join(f"rank {r}" for r in suspect_ranks)
        why = (
            f"{named} named after step {step} ({verdict.value}, on {', '.join(nodes) or 'no named node'}): "
            "more than one suspect points to a shared cause, so no node is quarantined"
        )
        return NodeQuarantine(SdcNodeAction.KEEP, "", why)
    (rank,), (node,) = suspect_ranks, nodes
    if confidence < min_confidence:
        why = f"rank {rank} on {node} is named with confidence {confidence:.2f} (< {min_confidence:.2f}): not quarantined"
        return NodeQuarantine(SdcNodeAction.KEEP, "", why)
    shown = ", ".join(tensors[:SHOWN_TENSORS]) + (" ..." if len(tensors) > SHOWN_TENSORS else "")
    why = (
        f"silent data corruption after step {step}: rank {rank} on {node} {how} "
        f"({verdict.value}, confidence {confidence:.2f})" + (f"; tensors {shown}" if shown else "")
    )
    return NodeQuarantine(SdcNodeAction.QUARANTINE, node, why)


class SdcNodeExit(Label):
    """Whether a quarantined node also leaves the running attempt (its quarantine keeps it out of the
    job's next starts either way)."""

    LEAVE = "sdc_exclude"  # the job goes on at a valid size without it: stop its workers now and leave
    STAY = (
        "sdc_stay"  # leaving would end the job, or the quarantine was capped: it stays until the next start
    )


@dataclass(frozen=True)
class NodeExit:
    action: SdcNodeExit
    reason: str
    nodes_left: int = 0  # the nodes the job goes on with (LEAVE)


def exit_after_quarantine(
    node: str,
    state: str,
    world: WorldPlan | None,
    min_nodes: int,
    max_nodes: int,
    rule: SizeRule = SizeRule(),
    hosts: str = "",
) -> NodeExit:
    """Whether ``node``, just recorded in ``state`` for silent data corruption, leaves the running
    attempt now, as an excluded straggler does. Its replicas rolled back to clean state already, but
    the device that corrupted one step can corrupt the next: out at once when the other nodes (and hot
    spares) still make a valid world size within ``[min_nodes, max_nodes]``. It stays when the
    lifecycle did not quarantine it (the blast-radius cap left it suspect: a human decides), when
    leaving would leave no valid size, or when its agent serves a store the other nodes need
    (``hosts``: the rendezvous store; the round's store, which the job's first node serves): in the
    last two the job would end, so it goes on, checked every interval."""
    if state.partition(" ")[0] != NodeState.QUARANTINED.value:  # "quarantined (drain: slurm)" is one
        why = f"{node} is {state}, not quarantined (the lifecycle decides, within its blast-radius cap): it stays in the job"
        return NodeExit(SdcNodeExit.STAY, why)
    if world is None:  # a job of this one node
        world = WorldPlan((node,), (), 1, "this node only")
    if pinned := needed_by_others(node, world, hosts):
        why = (
            f"{pinned}; it stays, its replicas rolled back and checked every interval, and the quarantine "
            "keeps it out from the next start"
        )
        return NodeExit(SdcNodeExit.STAY, why)
    others = [n for n in (*world.active, *world.spares) if n != node]
    plan = plan_world(others, world.nproc_per_node, 1, max(1, max_nodes), rule) if others else None
    if plan is None or len(plan.active) < min_nodes:
        why = (
            f"without {node} no valid world size is left ({len(others)} other node(s), at least {min_nodes} "
            "needed): it stays, its replicas rolled back and checked every interval, and the quarantine keeps it "
            "out from the next start"
        )
        return NodeExit(SdcNodeExit.STAY, why)
    spare = [n for n in plan.active if n in world.spares]
    how = f"with hot spare {', '.join(spare)}" if spare else f"at {len(plan.active)} node(s)"
    why = f"{node} is quarantined for silent data corruption: it leaves now and the job goes on {how}"
    return NodeExit(SdcNodeExit.LEAVE, why, len(plan.active))
