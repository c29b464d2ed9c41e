"""The in-place board's records and its port: what one node's agent tells the others when its group
re-forms, shrinks or grows in place (launch/inplace/board_state.py holds them in one document,
launch/inplace/board.py carries it over the round's store).

Each record has one meaning: an :class:`Announcement` says which generation every rank re-forms into
(its ``ranks``: the ranks whose processes are new in it, replacements or newcomers); a
:class:`GroupRecord` says which nodes the group holds since it last resized; an
:class:`InvitationRecord` gives newcomers their places. :class:`Board`, the port the in-place recovery
speaks through, hands all three over as announcements; it never waits. Every record is data read from
a store another process could write: its reader checks every field and names what is wrong, and
nothing in it is trusted before its seal holds (job_key.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeGuard


@dataclass(frozen=True)
class Announcement:
    generation: int  # the generation every rank re-forms into
    node: str  # the node whose agent replaced its failed ranks (or decided the shrink)
    ranks: tuple[int, ...]  # the ranks replaced
    # a group that shrank in place (a lost node, no hot spare): the new world size and the surviving
    # nodes in their new group-rank order; 0 and () when every node keeps its place
    world_size: int = 0
    active: tuple[str, ...] = ()

    def encode(self) -> bytes:
        doc: dict[str, object] = {"generation": self.generation, "node": self.node, "ranks": list(self.ranks)}
        if self.world_size:
            doc.update(world_size=self.world_size, active=list(self.active))
        return json.dumps(doc).encode()

    def place(self, node: str, nproc_per_node: int) -> tuple[int, int] | None:
        """(first global rank, world size) of ``node`` in the shrunk group; None when the group did not
        shrink or ``node`` is not in it."""
        if not self.world_size or node not in self.active:
            return None
        return self.active.index(node) * nproc_per_node, self.world_size

    @staticmethod
    def decode(raw: bytes) -> Announcement:
        """Parse a stored announcement; ValueError names what is wrong with it."""
        return announcement_from(json_object(raw))


def json_object(raw: bytes) -> dict[str, object]:
    """The JSON object in ``raw``; ValueError says why it is not one."""
    try:
        doc = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    return doc


def announcement_from(doc: dict[str, object]) -> Announcement:
    """An :class:`Announcement` from its decoded JSON object; ValueError names what is wrong."""
    gen, node, ranks = doc.get("generation"), doc.get("node"), doc.get("ranks")
    if not is_count(gen):
        raise ValueError(f"generation {gen!r} is not a positive integer")
    if not is_name(node):
        raise ValueError("node is not a name")
    if not is_ranks(ranks):
        raise ValueError("ranks is not a list of ranks")
    world, active = doc.get("world_size", 0), doc.get("active", [])
    if world == 0 and active == []:
        return Announcement(gen, node, tuple(ranks))
    return Announcement(gen, node, tuple(ranks), *layout(world, active, node))


def layout(world: object, active: object, node: str) -> tuple[int, tuple[str, ...]]:
    """A group's (world size, nodes in group-rank order) as read; ValueError names what is wrong."""
    if not is_count(world):
        raise ValueError(f"world_size {world!r} is not a positive integer")
    if not isinstance(active, list) or not active or not all(is_name(n) for n in active):
        raise ValueError("active is not a list of node names")
    if len(set(active)) != len(active) or node not in active:
        raise ValueError("active repeats a node or lacks the announcing node")
    if world % len(active):
        raise ValueError(f"world_size {world} is not a multiple of {len(active)} nodes")
    return world, tuple(active)


def is_ranks(v: object) -> TypeGuard[list[int]]:
    return isinstance(v, list) and all(is_count(r) or r == 0 for r in v)


@dataclass(frozen=True)
class GroupRecord:
    """The group's nodes and size since it last shrank or grew in place, written by its first node for
    nodes that arrive later (:func:`~stalwart.launch.inplace.rejoin.find_place`)."""

    generation: int  # the generation the group re-formed into
    node: str  # the first node, which decided the resize
    world_size: int
    active: tuple[str, ...]  # the nodes in group-rank order

    @staticmethod
    def of(a: Announcement) -> GroupRecord:
        return GroupRecord(a.generation, a.node, a.world_size, a.active)

    def as_announcement(self) -> Announcement:
        """The :class:`Announcement` form the :class:`Board` port speaks (no ranks: none re-formed)."""
        return Announcement(self.generation, self.node, (), self.world_size, self.active)

    def to_doc(self) -> dict[str, object]:
        return {
            "generation": self.generation,
            "node": self.node,
            "world_size": self.world_size,
            "active": list(self.active),
        }

    @staticmethod
    def from_doc(doc: dict[str, object]) -> GroupRecord:
        gen, node = doc.get("generation"), doc.get("node")
        if not is_count(gen):
            raise ValueError(f"generation {gen!r} is not a positive integer")
        if not is_name(node):
            raise ValueError("node is not a name")
        return GroupRecord(gen, node, *layout(doc.get("world_size"), doc.get("active"), node))


@dataclass(frozen=True)
class InvitationRecord:
    """The places the first node gives newcomers: their ranks start in ``generation`` of the grown
    group (:class:`~stalwart.launch.inplace.nodes.NodeRecovery`)."""

    generation: int  # the generation the newcomers' ranks start in
    node: str  # the first node, which invites
    newcomer_ranks: tuple[int, ...]  # the global ranks the newcomers' processes take
    world_size: int
    active: tuple[str, ...]  # the grown group's nodes in group-rank order, newcomers included

    @staticmethod
    def of(a: Announcement) -> InvitationRecord:
        return InvitationRecord(a.generation, a.node, a.ranks, a.world_size, a.active)

    def as_announcement(self) -> Announcement:
        """The :class:`Announcement` form the :class:`Board` port speaks (its ranks: the newcomers')."""
        return Announcement(self.generation, self.node, self.newcomer_ranks, self.world_size, self.active)

    def to_doc(self) -> dict[str, object]:
        return {
            "generation": self.generation,
            "node": self.node,
            "newcomer_ranks": list(self.newcomer_ranks),
            "world_size": self.world_size,
            "active": list(self.active),
        }

    @staticmethod
    def from_doc(doc: dict[str, object]) -> InvitationRecord:
        gen, node, ranks = doc.get("generation"), doc.get("node"), doc.get("newcomer_ranks")
        if not is_count(gen):
            raise ValueError(f"generation {gen!r} is not a positive integer")
        if not is_name(node):
            raise ValueError("node is not a name")
        if not is_ranks(ranks):
            raise ValueError("newcomer_ranks is not a list of ranks")
        world, active = layout(doc.get("world_size"), doc.get("active"), node)
        return InvitationRecord(gen, node, tuple(ranks), world, active)


def is_count(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def is_name(v: object) -> TypeGuard[str]:
    return isinstance(v, str) and 0 < len(v) <= 256


class Board(Protocol):
    """The port the in-place recovery uses to tell other nodes, and to hear from them."""

    def announce(self, a: Announcement) -> None:
        """Hand an announcement over; never waits on the network."""
        ...

    def latest(self) -> Announcement | None:
        """The newest announcement seen (ours included); never waits."""
        ...

    def close(self, leaving: bool = False) -> None:
        """Stop; ``leaving``: this agent leaves a job that goes on without it (it excluded its node)."""
        ...

    def waiting(self, generation: int) -> None:
        """Say that this node's ranks wait for ``generation`` (a lost peer nobody announced)."""
        ...

    def refuse(self, reason: str) -> None:
        """Say that this node's failure is not recovered in place (the others stop waiting)."""
        ...

    def refusal(self) -> tuple[str, str] | None:
        """(node, reason) of the first node that said so, once read; never waits."""
        ...

    def silence(self) -> dict[str, float]:
        """Seconds since each watched node's heartbeat last moved."""
        ...

    def dead(self) -> dict[str, float]:
        """Watched nodes whose agent process is gone (the kernel closed its connection) or that left
        the job on purpose, and the seconds since that was seen."""
        ...

    def left(self) -> frozenset[str]:
        """The nodes of :meth:`dead` that left the job on purpose (their agent excluded its node)."""
        ...

    def publish_group(self, a: Announcement) -> None:
        """Record the group's nodes and size after it shrank or grew in place; never waits."""
        ...

    def offers(self) -> tuple[str, ...]:
        """Nodes that arrived during the job and offer a free place, in order; never waits."""
        ...

    def offer_seq(self, node: str) -> int:
        """How many times ``node`` offered; never waits."""
        ...

    def watch_more(self, nodes: Sequence[str]) -> None:
        """Watch the heartbeats of ``nodes`` too."""
        ...

    def invite(self, a: Announcement) -> None:
        """Give newcomers their places in ``a.generation``; never waits."""
        ...

    def ready(self, generation: int) -> None:
        """Say that this node's ranks are about to join ``generation``; never waits."""
        ...

    def ready_nodes(self) -> dict[str, int]:
        """Offered nodes whose ranks are ready, and the generation; never waits."""
        ...


__all__ = [
    "Announcement",
    "Board",
    "GroupRecord",
    "InvitationRecord",
    "announcement_from",
    "is_count",
    "is_name",
    "json_object",
    "layout",
]
