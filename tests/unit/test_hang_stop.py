"""How the agent stops a hung group (launch/attempt/hang_monitor.py ``stop_hung``): the hung rank
first when its peers leave their live state, every rank at once otherwise."""

from __future__ import annotations

import signal

from stalwart.launch.attempt.hang_monitor import stop_hung
from stalwart.launch.fakes import FakeGroup


def test_a_local_hung_rank_is_killed_before_its_peers_get_their_grace():
    group = FakeGroup.of(range(4))
    stop_hung(group, 2, 3.0)
    assert (group.signals, group.stops) == ([signal.SIGKILL], [3.0])


def test_without_left_state_or_a_local_hung_rank_every_rank_stops_at_once():
    group = FakeGroup.of(range(4))
    stop_hung(group, 2, 0.0)  # no peer leaves its state
    assert (group.signals, group.stops) == ([], [0.0])
    remote = FakeGroup.of(range(4))
    stop_hung(remote, 6, 3.0)  # the hung rank is another node's: nothing here ends its collective
    assert (remote.signals, remote.stops) == ([], [0.0])
