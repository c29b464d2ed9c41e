"""World-size policy: the largest valid size from the healthy nodes, with the rest as hot spares.

Pure functions. A size is valid when the world size (nodes x processes per node) satisfies the rule:
a power of two, or a multiple of a divisor (e.g. tensor x pipeline parallel degree). Nodes beyond
the largest valid size are hot spares; when an active node fails a spare takes its slot, so every
other node keeps its position (and its ranks). A node whose agent serves a store the others need
never leaves the running job (:func:`needed_by_others`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from typing_extensions import assert_never

from ..errors import ConfigError
from .label import Label


class SizeRuleKind(Label):
    """Which world sizes are valid."""

    POWER_OF_TWO = "power_of_two"
    MULTIPLE = "multiple"  # a multiple of the rule's divisor


@dataclass(frozen=True, init=False)
class SizeRule:
    kind: SizeRuleKind = field(default=SizeRuleKind.POWER_OF_TWO)
    divisor: int = 1

    def __init__(self, kind: SizeRuleKind | str = SizeRuleKind.POWER_OF_TWO, divisor: int = 1) -> None:
        """``kind`` also as its name from a configuration ("power_of_two", "multiple")."""
        try:
            rule = SizeRuleKind(kind)
        except ValueError:
            raise ConfigError(f"unknown size rule {kind!r}", "use 'power_of_two' or 'multiple'") from None
        if divisor < 1:
            raise ConfigError(f"size divisor must be >= 1, got {divisor}")
        object.__setattr__(self, "kind", rule)
        object.__setattr__(self, "divisor", divisor)

    def valid(self, world_size: int) -> bool:
        if world_size < 1:
            return False
        match self.kind:
            case SizeRuleKind.POWER_OF_TWO:
                return world_size & (world_size - 1) == 0
            case SizeRuleKind.MULTIPLE:
                return world_size % self.divisor == 0
            case _:
                assert_never(self.kind)

    def describe(self) -> str:
        match self.kind:
            case SizeRuleKind.POWER_OF_TWO:
                return "a power of two"
            case SizeRuleKind.MULTIPLE:
                return f"a multiple of {self.divisor}"
            case _:
                assert_never(self.kind)


@dataclass(frozen=True)
class WorldPlan:
    active: tuple[str, ...]
    spares: tuple[str, ...]
    nproc_per_node: int
    reason: str

    @property
    def world_size(self) -> int:
        return len(self.active) * self.nproc_per_node

    @property
    def runnable(self) -> bool:
        return bool(self.active)


def _check(nproc_per_node: int, min_nodes: int, max_nodes: int) -> None:
    if nproc_per_node < 1:
        raise ConfigError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    if min_nodes < 1 or max_nodes < min_nodes:
        raise ConfigError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}..{max_nodes}")


def plan_world(
    healthy: Sequence[str], nproc_per_node: int, min_nodes: int, max_nodes: int, rule: SizeRule = SizeRule()
) -> WorldPlan:
    """Largest valid node count within [min_nodes, max_nodes] from ``healthy`` (order is preference)."""
    _check(nproc_per_node, min_nodes, max_nodes)
    nodes = list(dict.fromkeys(healthy))
    for n in range(min(len(nodes), max_nodes), min_nodes - 1, -1):
        if rule.valid(n * nproc_per_node):
            spares = tuple(nodes[n:])
            extra = f"; {len(spares)} hot spare(s): {', '.join(spares)}" if spares else ""
            why = (
                f"{len(nodes)} healthy node(s); {n} x {nproc_per_node} = {n * nproc_per_node} processes is the "
                f"largest world size that is {rule.describe()} within {min_nodes}..{max_nodes} nodes{extra}"
            )
            return WorldPlan(tuple(nodes[:n]), spares, nproc_per_node, why)
    return WorldPlan(
        (),
        tuple(nodes),
        nproc_per_node,
        f"cannot run: {len(nodes)} healthy node(s) give no world size that is {rule.describe()} "
        f"with at least {min_nodes} node(s) of {nproc_per_node} process(es)",
    )


def replace_failed(
    plan: WorldPlan,
    failed: Iterable[str],
    min_nodes: int,
    max_nodes: int,
    rule: SizeRule = SizeRule(),
    returned: Iterable[str] = (),
) -> WorldPlan:
    """The plan after ``failed`` nodes drop out (and ``returned`` ones come back as spares).

    Spares step into the failed nodes' slots, keeping everyone else in place. Only when the spares
    run out is the job re-planned at a smaller valid size.
    """
    gone = set(failed)
    spares = [s for s in plan.spares if s not in gone]
    spares += [r for r in returned if r not in gone and r not in plan.active and r not in spares]
    active = list(plan.active)
    stepped = []
    for i, node in enumerate(active):
        if node in gone:
            if spares:
                active[i] = spares.pop(0)
                stepped.append(f"{active[i]} replaces {node}")
            else:
                active[i] = ""
    if "" not in active:
        if not stepped:
            return WorldPlan(tuple(active), tuple(spares), plan.nproc_per_node, plan.reason)
        return WorldPlan(
            tuple(active),
            tuple(spares),
            plan.nproc_per_node,
            f"hot spare stepped in ({'; '.join(stepped)}); world size stays "
            f"{len(active) * plan.nproc_per_node}"
            + (f"; spares left: {', '.join(spares)}" if spares else "; no spares left"),
        )
    remaining = [n for n in active if n] + spares
    new = plan_world(remaining, plan.nproc_per_node, min_nodes, max_nodes, rule)
    lost = ", ".join(sorted(gone & set(plan.active)))
    prefix = f"lost {lost} with no spare left: "
    if stepped:
        prefix = f"{'; '.join(stepped)}; " + prefix
    return WorldPlan(new.active, new.spares, new.nproc_per_node, prefix + new.reason)


def needed_by_others(node: str, world: WorldPlan | None, hosts: str = "") -> str:
    """Why ``node`` must not leave the running job, or "" when it may (pure).

    Its agent may serve a store the other nodes need: ``hosts`` names the ones it says it serves (the
    c10d rendezvous store), and the group's first node serves the round's store whenever others run
    with it. Its exit would take that store with it and end the job for every node, so neither a
    quarantine for silent data corruption (``policy/sdc.py``) nor a straggler's exclusion
    (``diagnose/straggler_action.py``) may make it leave; both say this reason instead."""
    if world is not None and world.active[:1] == (node,) and len(world.active) > 1:
        hosts = " and ".join(h for h in (hosts, "the round's store (as the group's first node)") if h)
    if not hosts:
        return ""
    return (
        f"{node}'s agent serves {hosts}, which the other nodes need: leaving would end the job for every node"
    )
