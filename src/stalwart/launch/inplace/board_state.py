"""The in-place board as one versioned document: its state, the changes an agent makes to it, and its
seal (launch/inplace/board.py keeps it in the round's worker store).

Like torch elastic's ``_RendezvousState``, the whole board is one value written by compare-and-set on
the bytes its writer last read: a writer reads the state, applies its :class:`Change` with
:func:`apply` (a pure function: the protocol is data and is tested without a store), and sets the
result only if nobody wrote in between; otherwise it applies its change again to what it found. Every
write counts the version up by one.

The document is sealed as one record (:func:`seal`) bound to the job key, the round's store (its
address and port) and its purpose; :func:`open_state` returns it only when the seal holds, it is well
formed, and its version is not older than one the reader already saw (a replayed state). What fails
is :class:`Unsound`, with what and why, and is never trusted.

Schema (JSON, before the seal)::

    {"schema": 1, "version": 7,
     "announcement": {"generation", "node", "ranks", ["world_size", "active"]} | null,
     "group": {"generation", "node", "world_size", "active"} | null,
     "invitation": {"generation", "node", "newcomer_ranks", "world_size", "active"} | null,
     "offers": [{"node", "seq", "standing"}, ...],   # in the order of each node's last offer
     "ready": {node: generation}, "waiting": {node: generation},
     "refusal": {"node", "reason"} | null, "claims": {lost node: holder}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TypeGuard

from typing_extensions import assert_never

from ...job_key import Opened, Refused, Signer
from ...node_name import printable_name
from .board_records import (
    Announcement,
    GroupRecord,
    InvitationRecord,
    announcement_from,
    is_count,
    is_name,
    json_object,
)

SCHEMA = 1
REASON_MAX = 500


@dataclass(frozen=True)
class Standing:
    """A node's offer of itself for a free place: how many times it offered, and whether it stands."""

    node: str
    seq: int  # offers made (a node that starts again offers anew, and counts up)
    standing: bool  # False once it withdrew


@dataclass(frozen=True)
class BoardState:
    version: int = 0
    announcement: Announcement | None = None
    group: GroupRecord | None = None
    invitation: InvitationRecord | None = None
    offers: tuple[Standing, ...] = ()
    ready: dict[str, int] = field(default_factory=dict)  # offered node -> generation its ranks join
    waiting: dict[str, int] = field(default_factory=dict)  # node -> generation its ranks wait for
    refusal: tuple[str, str] | None = None  # (node, reason) of the first node that refused
    claims: dict[str, str] = field(default_factory=dict)  # lost node -> the spare holding its place


# --- the changes: one meaning each --------------------------------------------------------------------


@dataclass(frozen=True)
class Announce:
    """Every rank re-forms into ``a.generation`` (a newer or equal generation replaces the last)."""

    a: Announcement


@dataclass(frozen=True)
class PublishGroup:
    """The group's nodes and size after it shrank or grew in place."""

    group: GroupRecord


@dataclass(frozen=True)
class Invite:
    """Newcomers start their ranks in ``invitation.generation``."""

    invitation: InvitationRecord


@dataclass(frozen=True)
class Offer:
    """``node`` (arrived during the job) offers itself for a free place."""

    node: str


@dataclass(frozen=True)
class Withdraw:
    """``node`` gave up waiting for a place."""

    node: str


@dataclass(frozen=True)
class Ready:
    """``node``'s ranks are about to join ``generation``."""

    node: str
    generation: int


@dataclass(frozen=True)
class Wait:
    """``node``'s ranks wait for ``generation``, which nobody announced."""

    node: str
    generation: int


@dataclass(frozen=True)
class Refuse:
    """``node``'s failure is not recovered in place; the first refusal stands."""

    node: str
    reason: str


@dataclass(frozen=True)
class Claim:
    """``holder`` takes ``lost``'s place; the first claim on a place stands."""

    lost: str
    holder: str


Change = Announce | PublishGroup | Invite | Offer | Withdraw | Ready | Wait | Refuse | Claim


def apply(state: BoardState, change: Change) -> BoardState:
    """The state after ``change`` (the version is counted up by the write, :func:`write`)."""
    match change:
        case Announce(a=a):
            last = state.announcement
            return (
                state
                if last is not None and last.generation > a.generation
                else replace(state, announcement=a)
            )
        case PublishGroup(group=group):
            return replace(state, group=group)
        case Invite(invitation=invitation):
            return replace(state, invitation=invitation)
        case Offer(node=node):
            seq = next((o.seq for o in state.offers if o.node == node), 0) + 1
            return replace(state, offers=_moved_last(state.offers, Standing(node, seq, True)))
        case Withdraw(node=node):
            seq = next((o.seq for o in state.offers if o.node == node), 0)
            return replace(state, offers=_moved_last(state.offers, Standing(node, seq, False)))
        case Ready(node=node, generation=gen):
            return replace(state, ready={**state.ready, node: gen})
        case Wait(node=node, generation=gen):
            return replace(state, waiting={**state.waiting, node: gen})
        case Refuse(node=node, reason=reason):
            return state if state.refusal is not None else replace(state, refusal=(node, reason[:REASON_MAX]))
        case Claim(lost=lost, holder=holder):
            return state if lost in state.claims else replace(state, claims={**state.claims, lost: holder})
        case _:
            assert_never(change)


def write(state: BoardState, changes: tuple[Change, ...]) -> BoardState:
    """The next version: ``changes`` applied in order to ``state``."""
    for change in changes:
        state = apply(state, change)
    return replace(state, version=state.version + 1)


def _moved_last(offers: tuple[Standing, ...], entry: Standing) -> tuple[Standing, ...]:
    return (*(o for o in offers if o.node != entry.node), entry)


# --- the document ----------------------------------------------------------------------------------


def encode(state: BoardState) -> bytes:
    a, g, i = state.announcement, state.group, state.invitation
    doc = {
        "schema": SCHEMA,
        "version": state.version,
        "announcement": json.loads(a.encode()) if a is not None else None,
        "group": g.to_doc() if g is not None else None,
        "invitation": i.to_doc() if i is not None else None,
        "offers": [{"node": o.node, "seq": o.seq, "standing": o.standing} for o in state.offers],
        "ready": state.ready,
        "waiting": state.waiting,
        "refusal": {"node": state.refusal[0], "reason": state.refusal[1]} if state.refusal else None,
        "claims": state.claims,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(raw: bytes) -> BoardState:
    """The state in ``raw``; ValueError names the first thing wrong with it."""
    doc = json_object(raw)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"schema {doc.get('schema')!r} is not {SCHEMA}")
    version = doc.get("version")
    if not is_count(version):
        raise ValueError(f"version {version!r} is not a positive integer")
    return BoardState(
        version=version,
        announcement=_part(doc, "announcement", announcement_from),
        group=_part(doc, "group", GroupRecord.from_doc),
        invitation=_part(doc, "invitation", InvitationRecord.from_doc),
        offers=_offers(doc.get("offers")),
        ready=_generations(doc.get("ready"), "ready"),
        waiting=_generations(doc.get("waiting"), "waiting"),
        refusal=_refusal(doc.get("refusal")),
        claims=_claims(doc.get("claims")),
    )


def _part(doc: dict[str, object], name: str, parse):  # noqa: ANN001, ANN202 - one of three parsers
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not an object")
    try:
        return parse(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _offers(value: object) -> tuple[Standing, ...]:
    if not isinstance(value, list):
        raise ValueError("offers is not a list")
    out: list[Standing] = []
    for o in value:
        if (
            not isinstance(o, dict)
            or not _printable(o.get("node"))
            or not isinstance(o.get("standing"), bool)
        ):
            raise ValueError("an offer is not {node, seq, standing}")
        seq = o.get("seq")
        if not (is_count(seq) or seq == 0) or any(s.node == o["node"] for s in out):
            raise ValueError(f"the offer of {printable_name(o['node'])} has a bad count or repeats")
        out.append(Standing(o["node"], seq, o["standing"]))
    return tuple(out)


def _generations(value: object, name: str) -> dict[str, int]:
    if not isinstance(value, dict) or not all(_printable(k) and is_count(g) for k, g in value.items()):
        raise ValueError(f"{name} is not a map of node names to generations")
    return dict(value)


def _refusal(value: object) -> tuple[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not is_name(node := value.get("node")):
        raise ValueError("refusal is not {node, reason}")
    reason = value.get("reason")
    if not isinstance(reason, str):
        raise ValueError("refusal has no reason")
    return printable_name(node), printable_name(reason[:REASON_MAX], limit=REASON_MAX)


def _claims(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(_printable(k) and _printable(h) for k, h in value.items()):
        raise ValueError("claims is not a map of node names to node names")
    return dict(value)


def _printable(v: object) -> TypeGuard[str]:
    return is_name(v) and v.isprintable()


# --- the seal ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unsound:
    """Stored bytes that are not this job's current board state: what they are, and why."""

    what: str
    why: str


def context(where: str) -> str:
    """What a board state's seal binds: its purpose and the round's store (``addr:port``)."""
    return f"board/state|{where}"


def seal(signer: Signer, where: str, state: BoardState) -> bytes:
    """``state`` sealed with the job key, bound to the round's store at ``where``."""
    return signer.seal(context(where), encode(state))


def open_state(signer: Signer, where: str, raw: bytes, seen: int) -> BoardState | Unsound:
    """The state ``raw`` holds, when sealed with the job key for this round's store, well formed, and
    not older than version ``seen`` (an older one is replayed)."""
    match signer.open(context(where), raw):
        case Refused(reason):
            return Unsound("an unsigned board state in the worker store", reason)
        case Opened(payload):
            try:
                state = decode(payload)
            except ValueError as exc:
                return Unsound("a malformed board state in the worker store", str(exc))
            if state.version < seen:
                return Unsound(
                    "a replayed board state in the worker store", f"version {state.version} after {seen}"
                )
            return state


__all__ = [
    "Announce",
    "BoardState",
    "Change",
    "Claim",
    "Invite",
    "Offer",
    "PublishGroup",
    "Ready",
    "Refuse",
    "Standing",
    "Unsound",
    "Wait",
    "Withdraw",
    "apply",
    "decode",
    "encode",
    "open_state",
    "seal",
    "write",
]
