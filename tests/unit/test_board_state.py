"""The in-place board's document (launch/inplace/board_state.py) without a store: each change, the order of
offers, first-wins claims and refusals, the round trip through JSON, what a malformed document is
refused for, and the seal (another key, another round, a replayed older version)."""

from __future__ import annotations

import json

import pytest

from stalwart.job_key import JobKey, KeySource
from stalwart.launch.inplace.board_records import Announcement, GroupRecord, InvitationRecord
from stalwart.launch.inplace.board_state import (
    Announce,
    BoardState,
    Claim,
    Invite,
    Offer,
    PublishGroup,
    Ready,
    Refuse,
    Standing,
    Unsound,
    Wait,
    Withdraw,
    apply,
    decode,
    encode,
    open_state,
    seal,
    write,
)

SIGNER = JobKey(b"k" * 32, KeySource.FILE).signer("job")
WHERE = "10.0.0.1:29500"
EMPTY = BoardState()
GROW = Announcement(3, "n0", (4, 5), 6, ("n0", "n1", "n2"))


def test_an_announcement_replaces_an_older_one_never_a_newer_one():
    s = apply(EMPTY, Announce(Announcement(2, "n0", (1,))))
    assert s.announcement == Announcement(2, "n0", (1,))
    assert apply(s, Announce(Announcement(1, "n1", (0,)))) == s
    assert apply(s, Announce(GROW)).announcement == GROW


def test_the_group_and_the_invitation_are_records_of_their_own():
    s = apply(apply(EMPTY, PublishGroup(GroupRecord.of(GROW))), Invite(InvitationRecord.of(GROW)))
    assert s.group == GroupRecord(3, "n0", 6, ("n0", "n1", "n2")) and s.announcement is None
    assert s.invitation is not None and s.invitation.newcomer_ranks == (4, 5)
    assert s.invitation.as_announcement() == GROW
    assert s.group.as_announcement() == Announcement(3, "n0", (), 6, ("n0", "n1", "n2"))


def test_offers_keep_the_order_of_the_last_offer_and_count_each_offer():
    s = EMPTY
    for change in (Offer("n2"), Offer("n3"), Withdraw("n2"), Offer("n2"), Withdraw("n9")):
        s = apply(s, change)
    assert s.offers == (
        Standing("n3", 1, True),
        Standing("n2", 2, True),
        Standing("n9", 0, False),
    )


def test_ready_and_wait_say_each_nodes_latest_generation():
    s = apply(apply(apply(EMPTY, Ready("n2", 3)), Wait("n0", 4)), Wait("n0", 5))
    assert s.ready == {"n2": 3} and s.waiting == {"n0": 5}
    assert EMPTY.ready == {} and EMPTY.waiting == {}  # the changes never touch the state they read


def test_the_first_claim_on_a_place_and_the_first_refusal_stand():
    s = apply(apply(EMPTY, Claim("n1", "s1")), Claim("n1", "s2"))
    assert s.claims == {"n1": "s1"}
    s = apply(apply(s, Refuse("n0", "x" * 900)), Refuse("n1", "later"))
    assert s.refusal == ("n0", "x" * 500)


def test_a_write_counts_the_version_up_once_for_all_its_changes():
    s = write(EMPTY, (Wait("n0", 1), Claim("n1", "s1")))
    assert s.version == 1 and s.waiting == {"n0": 1} and s.claims == {"n1": "s1"}
    assert write(s, ()).version == 2


def _full() -> BoardState:
    changes = (
        Announce(GROW),
        PublishGroup(GroupRecord.of(GROW)),
        Invite(InvitationRecord.of(GROW)),
        Offer("n2"),
        Withdraw("n3"),
        Ready("n2", 3),
        Wait("n1", 3),
        Refuse("n1", "rank 2 raised ValueError"),
        Claim("n1", "s1"),
    )
    return write(EMPTY, changes)


def test_the_document_round_trips():
    s = _full()
    assert decode(encode(s)) == s
    assert decode(encode(write(EMPTY, ()))) == write(EMPTY, ())


def _broken(**fields) -> bytes:
    doc = json.loads(encode(_full()))
    doc.update(fields)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\xff", "not JSON"),
        (b"[]", "not an object"),
        (_broken(schema=2), "schema 2 is not 1"),
        (_broken(version=0), "version 0 is not a positive integer"),
        (_broken(announcement={"generation": 0, "node": "n0", "ranks": []}), "announcement: generation"),
        (_broken(announcement=[1]), "announcement is not an object"),
        (_broken(group={"generation": 1, "node": "n0", "world_size": 3, "active": ["n0", "n1"]}), "group:"),
        (_broken(invitation={"generation": 1, "node": "n0", "world_size": 2, "active": ["n0"]}), "newcomer"),
        (_broken(offers=[{"node": "n2", "seq": 1}]), "an offer is not"),
        (_broken(offers=[{"node": "n2", "seq": 1, "standing": True}] * 2), "repeats"),
        (_broken(offers=[{"node": "bad\x07", "seq": 1, "standing": True}]), "an offer is not"),
        (_broken(ready={"n2": "3"}), "ready is not a map"),
        (_broken(waiting=[]), "waiting is not a map"),
        (_broken(refusal={"node": "n0"}), "refusal has no reason"),
        (_broken(claims={"n1": 7}), "claims is not a map"),
    ],
)
def test_a_malformed_document_is_refused_with_what_is_wrong(raw, why):
    with pytest.raises(ValueError, match=why):
        decode(raw)


def test_a_refusal_read_is_made_printable():
    s = decode(_broken(refusal={"node": "n0", "reason": "\x1b[31mred"}))
    assert s.refusal == ("n0", "\\x1b[31mred")


def test_only_a_state_sealed_with_the_key_for_this_round_and_not_older_opens():
    s = _full()
    assert open_state(SIGNER, WHERE, seal(SIGNER, WHERE, s), 0) == s
    assert open_state(SIGNER, WHERE, seal(SIGNER, WHERE, s), s.version) == s  # the same one again
    unsigned = open_state(SIGNER, WHERE, encode(s), 0)
    assert isinstance(unsigned, Unsound) and "unsigned" in unsigned.what
    other_key = JobKey(b"o" * 32, KeySource.FILE).signer("job")
    assert isinstance(open_state(SIGNER, WHERE, seal(other_key, WHERE, s), 0), Unsound)
    assert isinstance(open_state(SIGNER, WHERE, seal(SIGNER, "10.0.0.1:29501", s), 0), Unsound)
    replayed = open_state(SIGNER, WHERE, seal(SIGNER, WHERE, s), s.version + 1)
    assert (
        isinstance(replayed, Unsound) and "replayed" in replayed.what and "version 1 after 2" in replayed.why
    )
    malformed = open_state(SIGNER, WHERE, SIGNER.seal(f"board/state|{WHERE}", b"{}"), 0)
    assert isinstance(malformed, Unsound) and "malformed" in malformed.what
