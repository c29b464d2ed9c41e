"""Hang attribution: the least advanced rank is the culprit; a hang joins node evidence like a comm error."""

from __future__ import annotations

import pytest

from stalwart.diagnose.cross_layer import diagnose_comm_failure
from stalwart.diagnose.hang import RankPosition, attribute_hang
from stalwart.diagnose.incident import Component
from stalwart.diagnose.signals import from_failure, from_ps_states
from stalwart.errors import ConfigError
from stalwart.events import FailureDetected


def pos(rank, step, section, seen, node="n1", finished=False):
    return RankPosition(rank, node, step, section, seen, finished)


def test_rank_still_loading_data_is_the_culprit_not_the_ones_waiting_in_backward():
    ranks = [
        pos(0, 12, "backward", 100.0),
        pos(1, 12, "backward", 100.5),
        pos(2, 12, "data", 99.0, node="n2"),
        pos(3, 12, "backward", 100.2, node="n2"),
    ]
    h = attribute_hang(ranks, now=140.0, timeout_s=30.0)
    assert h.culprit == 2 and h.node == "n2" and h.victims == (0, 1, 3) and h.onset == 99.0
    assert h.reason == (
        "rank 2 on n2 silent 41.00s at step 12, section 'data' (timeout 30.00s, training); "
        "others at step 12 'backward'"
    )


def test_lower_step_beats_section_and_finished_ranks_do_not_count():
    ranks = [pos(0, 11, "optimizer", 50.0), pos(1, 12, "data", 50.0), pos(2, 3, None, 10.0, finished=True)]
    assert attribute_hang(ranks, now=100.0, timeout_s=30.0).culprit == 0


def test_no_verdict_before_the_timeout_or_without_live_ranks():
    assert attribute_hang([pos(0, 1, "data", 90.0)], now=100.0, timeout_s=30.0) is None
    assert attribute_hang([pos(0, 1, "data", 0.0, finished=True)], now=100.0, timeout_s=30.0) is None
    with pytest.raises(ConfigError):
        attribute_hang([], now=0.0, timeout_s=0.0)


def test_a_hang_on_a_rank_in_d_state_is_a_hung_mount():
    h = attribute_hang(
        [pos(0, 5, "backward", 100.0), pos(1, 5, "data", 98.0, node="n2")], now=400.0, timeout_s=300.0
    )
    hang = from_failure(
        FailureDetected(
            ts=400.0, node=h.node, rank=h.culprit, failure="hang", onset=h.onset, evidence=h.reason
        )
    )
    assert hang.code == "process.hang"
    dstate = from_ps_states("77 D+ nfs_wait_bit_killable\n", "n2", 120.0, {77: 1})
    inc = diagnose_comm_failure([hang], dstate, now=400.0)
    assert inc.component is Component.MOUNT and inc.blast_radius.ranks == (1,)
    alone = diagnose_comm_failure([hang], [], now=400.0)
    assert alone.cause.startswith("hang with no node-level cause")
