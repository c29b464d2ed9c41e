"""A slow link across hosts (network namespaces, tests/hosts.py): one host's link limited to 1 Mbit/s by
``tc tbf`` both ways. Steps crawl but go on: no hang restart, and a "slow link" incident names the host.
"""

from __future__ import annotations

import time

import pytest

import hosts
from stalwart.events import FailureDetected, IncidentRaised, StragglerDetected

from .runner import events_so_far
from .test_hosts import _agent, _training_on_two

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(hosts.why_not()), reason=hosts.why_not() or "-")]

THROTTLE_S = 25.0  # shorter than the 40 s: a step at 1 Mbit/s takes ~10 s, so 2-3 steps


def _steps(run_dir, after: float, before: float = float("inf")) -> list:
    return [
        e
        for e in events_so_far(run_dir)
        if type(e).__name__ == "StepCompleted" and e.start > after and e.ts < before
    ]


def test_a_slow_link_is_not_a_hang_and_its_host_is_named(tmp_path):
    with hosts.Hosts(["h0", "h1"]) as h:
        procs = [_agent(h, n, tmp_path, "link-slow") for n in h.names]
        _training_on_two(tmp_path, procs)
        cut = time.time()
        h.slow("h1")
        deadline = time.monotonic() + THROTTLE_S
        # slow for THROTTLE_S, and on until a step begun after the cut has completed (on a busy
        # machine one crawling step can outlast the window): bounded, 120 s more at most
        last_chance = deadline + 120.0
        while time.monotonic() < deadline or (not _steps(tmp_path, cut) and time.monotonic() < last_chance):
            for p in procs:
                assert p.poll() is None, p.stdout.read()
            time.sleep(0.5)
        h.unslow("h1")
        healed = time.time()
        deadline = time.monotonic() + 60.0  # the crawling step ends, then full-speed steps on both hosts
        while time.monotonic() < deadline and {e.node for e in _steps(tmp_path, healed)} != {"h0", "h1"}:
            time.sleep(0.5)
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    hangs = [e for e in events_so_far(tmp_path, FailureDetected) if e.ts > cut]
    assert not hangs, f"the slow link was taken for a failure: {hangs}"
    crawled = _steps(tmp_path, cut, healed)
    assert crawled, "no step completed while the link was slow"
    assert {e.node for e in _steps(tmp_path, healed)} == {"h0", "h1"}, (
        "training did not go on after the link healed"
    )
    slow = [e for e in events_so_far(tmp_path, IncidentRaised) if e.ts > cut and "slow link" in e.cause]
    own = [e for e in slow if e.node == "h1"]
    assert own, f"the throttled host raised no slow-link incident: {slow}"
    # it names itself from its own link's over-limits; when its sends stayed under the limit during the
    # silence (the data was slow coming in, shaped on the bridge's side, out of its view) it cannot tell
    # which end is slow and names no host: it never blames the healthy one
    assert "h0" not in own[0].nodes, own[0]
    flagged = [e for e in events_so_far(tmp_path, StragglerDetected) if e.ts > cut and e.node == "h1"]
    if own[0].nodes:
        assert own[0].nodes == ("h1",) and "slow link on host h1" in own[0].cause, own[0]
        assert any("over-limit" in line for line in own[0].evidence), own[0].evidence
        # its communication time counts as straggler evidence on the slow host
        assert flagged and flagged[0].score > 1.0, flagged
    else:
        assert "slow coming in" in own[0].evidence[0] and "between hosts" in own[0].cause, own[0]
        # it cannot tell which end is slow, so it does not flag its own rank either (the incident is
        # raised once per silence: no later verdict of this silence flags it)
        assert not flagged, flagged
    # the other host saw its peer crawl and never blamed itself: it names h1 when its own sends waited
    # during the silence, and no host when they did not (on a busy machine either can come first:
    # the data was then only slow coming in, which its view cannot pin on either end)
    witness = [e for e in slow if e.node == "h0"]
    assert witness and all(w.nodes in (("h1",), ()) for w in witness), witness
    assert all("slow coming in" in w.evidence[0] for w in witness if not w.nodes), witness
    assert not [e for e in events_so_far(tmp_path, StragglerDetected) if e.ts > cut and e.node == "h0"]
