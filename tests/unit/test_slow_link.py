"""A slow link told apart from a hang: the link counters, the pure policy, and the hang monitor that
applies it, over hand-built samples and snapshots (no network, no clock, no sleep)."""

from __future__ import annotations

import dataclasses
import threading
from types import MappingProxyType

from stalwart.diagnose.precision import GateDecision, GateMode
from stalwart.diagnose.slow_link import (
    WORKERS,
    LinkWindow,
    Silence,
    SilenceKind,
    judge_silence,
    link_window,
    slow_link_incident,
)
from stalwart.diagnose.straggler_action import StragglerActionConfig
from stalwart.events import IncidentRaised, StepCompleted, StragglerCleared, StragglerDetected
from stalwart.health.link_counters import (
    IfCounters,
    LinkSample,
    LinkSampler,
    parse_heard,
    parse_qdiscs,
    parse_sockets,
    read_heard,
    read_sysfs,
)
from stalwart.launch.attempt.hang_monitor import HangMonitor
from stalwart.launch.attempt.straggler_monitor import StragglerMonitor
from stalwart.launch.attempt.straggler_records import record_stragglers
from stalwart.launch.decision import Decision, DecisionKind
from stalwart.launch.fakes import RecordingLedger
from stalwart.launch.snapshot import RankView, Snapshot
from stalwart.policy.timeouts import HangTimeoutPolicy
from stalwart.policy.world_size import WorldPlan

T0 = 1000.0
HANGS_ACTION = StragglerActionConfig()  # the default costs: a 300 s recovery
KBIT = 1000 / 8  # bytes/s per kbit/s


def sample(
    t: float, moved: int, over: int = 0, drops: int = 0, qdisc: str = "tbf", queued: int = 0
) -> LinkSample:
    c = IfCounters(
        rx_bytes=moved // 2, tx_bytes=moved - moved // 2, dropped=drops, qdisc=qdisc, qdisc_overlimits=over
    )
    peers = MappingProxyType({"10.77.0.1": (moved // 2, moved - moved // 2)})  # the workers' own sockets
    return LinkSample(t, MappingProxyType({"eth0": c}), peers, send_queued=queued)


def moving(
    t0: float, t1: float, bps: float, over_per_s: int = 0, qdisc: str = "tbf", queued: int = 0
) -> tuple[LinkSample, ...]:
    """One sample a second from t0 to t1 of a link moving ``bps`` bytes/s (``queued``: bytes its
    workers' sockets hold unsent at each sample)."""
    return tuple(
        sample(t0 + i, int(bps * i), over=over_per_s * i, qdisc=qdisc, queued=queued)
        for i in range(int(t1 - t0) + 1)
    )


# --- the counters -------------------------------------------------------------------------------------


def test_qdisc_counters_are_summed_per_interface_with_the_roots_kind():
    text = (
        '[{"kind":"tbf","dev":"eth0","root":true,"drops":3,"overlimits":40},'
        '{"kind":"pfifo","dev":"eth0","parent":"1:","drops":1,"overlimits":2},'
        '{"kind":"noqueue","dev":"eth1","root":true,"drops":0,"overlimits":0},{"nodev":1}]'
    )
    assert parse_qdiscs(text) == {"eth0": ("tbf", 4, 42), "eth1": ("noqueue", 0, 0)}
    assert parse_qdiscs("not json") == {} and parse_qdiscs("") == {}


def test_sysfs_counters_skip_loopback_and_sum_drops_and_errors(tmp_path):
    for name, vals in {"lo": (9, 9, 9), "eth0": (100, 50, 2)}.items():
        st = tmp_path / name / "statistics"
        st.mkdir(parents=True)
        (st / "rx_bytes").write_text(f"{vals[0]}\n")
        (st / "tx_bytes").write_text(f"{vals[1]}\n")
        (st / "tx_dropped").write_text(f"{vals[2]}\n")
        (st / "rx_errors").write_text("1\n")
    assert read_sysfs(tmp_path) == {"eth0": IfCounters(100, 50, 3)}
    assert read_sysfs(tmp_path / "absent") == {}


def test_the_sampler_samples_at_its_cadence_and_keeps_a_bounded_history():
    reads: list[int] = []

    def qdiscs():
        reads.append(1)
        return {"eth0": ("tbf", 0, len(reads))}

    def sockets(pids):
        assert list(pids) == [41, 42]
        return {"10.77.0.1": (100 * len(reads), 7)}, 5

    sampler = LinkSampler(
        lambda: [41, 42], lambda: {"eth0": IfCounters(1, 2, 0)}, qdiscs, sockets, keep_s=10.0, every_s=2.0
    )
    for t in range(0, 30):
        got = sampler.sample(T0 + t * 0.5)
    assert len(reads) == 8  # every 2 s over 14.5 s
    assert got[-1].ifaces["eth0"] == IfCounters(1, 2, 0, "tbf", 0, 8)
    assert got[-1].peers == {"10.77.0.1": (800, 7)} and got[-1].send_queued == 5
    assert got[-1].t - got[0].t <= 10.0 and len(got) == 6


def test_the_workers_sockets_are_summed_per_peer_and_other_processes_do_not_count():
    text = (
        '0      4096   10.77.0.2:41000 10.77.0.1:29500 users:(("python",pid=42,fd=9))\n'
        "\t cubic rtt:400/20 bytes_sent:9000 bytes_acked:8000 bytes_received:5000 delivery_rate 1000000bps\n"
        '0      0      [::ffff:10.77.0.2]:41001 [::ffff:10.77.0.1]:41002 users:(("python",pid=42,fd=10))\n'
        "\t cubic bytes_acked:2000 bytes_received:1000\n"
        '0      999    10.77.0.2:22 10.9.9.9:5000 users:(("sshd",pid=7,fd=3))\n'
        "\t cubic bytes_acked:123456 bytes_received:654321\n"
    )
    assert parse_sockets(text, {42}) == ({"10.77.0.1": (10_000, 6_000)}, 4096)
    assert parse_sockets(text, {99}) == ({}, 0)


def test_a_host_is_heard_as_recently_as_its_most_recent_segment_on_any_connection():
    """The silent-host check (launch/inplace/board.py): per asked host, the least ``lastrcv`` or
    ``lastack`` over every connection with it, whichever process holds it; other hosts are skipped."""
    text = (
        "0      0      10.77.0.1:29500 10.77.0.3:41000\n"
        "\t cubic rto:204 bytes_received:9 lastsnd:40 lastrcv:3100 lastack:2900 rcv_space:1\n"
        "0      0      [::ffff:10.77.0.1]:41001 [::ffff:10.77.0.3]:41002\n"
        "\t cubic bytes_acked:2000 lastsnd:10 lastrcv:2700 lastack:2600\n"
        "0      0      10.77.0.1:22 10.77.0.2:5000\n"
        "\t cubic lastsnd:5 lastrcv:5 lastack:5\n"
        "0      0      10.77.0.1:23 10.77.0.4:5000\n"
        "\t cubic lastsnd:5 lastrcv:7 lastack:8\n"
    )
    heard = parse_heard(text, {"10.77.0.3", "10.77.0.4", "10.77.0.9"})
    assert heard == {"10.77.0.3": 2.6, "10.77.0.4": 0.007}  # lastsnd is ours, never counted
    assert parse_heard("", {"10.77.0.3"}) == {}  # no connection with it: nothing known, not a silence


def test_a_loopback_address_reads_as_heard_without_a_dump_and_a_remote_one_still_needs_one(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)  # no ss: a dump would give no reading
    assert read_heard({"127.0.0.1", "::1", "localhost"}) == {"127.0.0.1": 0.0, "::1": 0.0, "localhost": 0.0}
    assert read_heard({"127.0.0.1", "10.77.0.3"}) is None  # the remote host needs ss: no reading


def test_with_the_workers_sockets_read_the_window_counts_their_bytes_per_peer():
    def at(t, sent, other):
        c = IfCounters(rx_bytes=other, tx_bytes=0, dropped=0)
        return LinkSample(t, MappingProxyType({"eth0": c}), MappingProxyType({"10.77.0.1": (sent, 0)}), 4096)

    w = link_window((at(T0, 0, 0), at(T0 + 4, 400_000, 10**9)), since=T0)
    assert w.bytes == 400_000 and w.source == "the workers' connections"  # not the other gigabyte
    assert w.per_peer == "10.77.0.1 400,000 bytes" and w.send_queued == 4096


# --- the window and the policy ----------------------------------------------------------------------


def test_the_window_starts_at_the_silences_onset_and_measures_the_newest_seconds_apart():
    samples = moving(T0, T0 + 10, 0) + moving(T0 + 11, T0 + 20, 0)  # quiet, then a jump
    samples = samples[:11] + tuple(sample(T0 + 10 + i, 125_000 * i, over=5 * i) for i in range(1, 11))
    w = link_window(samples, since=T0 + 10.0)
    assert w is not None and w.seconds == 10.0 and w.bytes == 1_250_000
    assert w.recent_bps == 125_000 and w.overlimits == 50 and w.shaped == "tbf on eth0"
    assert link_window(samples[:1], T0) is None


def test_a_tc_read_that_did_not_answer_is_not_a_count_of_zero():
    # on a busy host ``tc`` can miss its 1 s bound; the sample then holds no qdisc counts. When that
    # was the newest sample, the throttled host saw 0 over-limits and blamed its peer (a CI run)
    samples = tuple(sample(T0 + i, 125_000 * i, over=5 * i) for i in range(10))
    missed = dataclasses.replace(
        sample(T0 + 10, 1_250_000, over=0, qdisc=""), qdiscs_read=False
    )  # what LinkSampler records when read_qdiscs returns None
    w = link_window((*samples, missed), since=T0)
    assert w is not None and w.seconds == 10.0 and w.bytes == 1_250_000
    assert w.overlimits == 45 and w.shaped == "tbf on eth0"
    assert judge_silence(SILENT, w, 64 * KBIT).host == "h1"
    none_read = tuple(dataclasses.replace(s, qdiscs_read=False) for s in samples)
    w = link_window(none_read, since=T0)
    assert w is not None and w.overlimits == 0 and w.shaped == ""


def test_the_hosts_own_throttling_counts_over_the_whole_silence_not_only_its_sampled_part():
    # a CI run: the throttled host sent its share at the start of the collective (over its limit),
    # then only received (its ingress shaped on the switch side); on a busy host the first sample
    # inside the silence came late, and the window saw no over-limit: it named its peer instead
    before = sample(T0, 0, over=0)
    sending = sample(T0 + 2.2, 250_000, over=40)  # the sampler was late: the first sample inside
    receiving = sample(T0 + 3.2, 350_000, over=40)
    w = link_window((before, sending, receiving), since=T0 + 0.1)
    assert w is not None and w.seconds == 1.0 and w.bytes == 100_000  # progress: inside only
    assert w.overlimits == 40
    assert judge_silence(SILENT, w, 64 * KBIT).host == "h1"


def test_an_ss_read_that_did_not_answer_is_skipped_not_taken_for_silence():
    # the newest sample's ``ss`` timed out: the window still counts the workers' own bytes (before,
    # it fell back to "could not be read" and a crawling collective became a hang)
    samples = tuple(sample(T0 + i, 125_000 * i, over=5 * i) for i in range(10))
    missed = dataclasses.replace(sample(T0 + 10, 1_250_000, over=50), peers=None)
    w = link_window((*samples, missed), since=T0)
    assert w is not None and w.source == WORKERS and w.seconds == 9.0 and w.bytes == 1_125_000
    assert w.recent_bps == 125_000 and w.overlimits == 50
    assert judge_silence(SILENT, w, 64 * KBIT).kind is SilenceKind.SLOW_LINK
    only_one = (samples[0], *(dataclasses.replace(s, peers=None) for s in samples[1:]))
    w = link_window(only_one, since=T0)
    assert w is not None and w.source != WORKERS


def test_the_sampler_records_a_missed_tc_read_as_not_read():
    answers = iter([{"eth0": ("tbf", 0, 3)}, None])
    sampler = LinkSampler(lambda: [], lambda: {"eth0": IfCounters(1, 2, 0)}, lambda: next(answers))
    first = sampler.sample(T0)[-1]
    second = sampler.sample(T0 + 2)[-1]
    assert first.qdiscs_read and first.ifaces["eth0"].qdisc_overlimits == 3
    assert not second.qdiscs_read


SILENT = Silence("h1", ("h0",), 0, "backward", 8.0, 3.0, 1800.0, 0.2)


def window(bps: float, over: int = 0, drops: int = 0, recent: float | None = None) -> LinkWindow:
    recent_bps = bps if recent is None else recent
    return LinkWindow(8.0, int(bps * 8), recent_bps, drops, over, "tbf on eth0", source=WORKERS)


def test_only_the_workers_own_traffic_between_hosts_is_evidence_of_a_slow_link():
    # on one host the ranks talk over loopback, where other processes' traffic moves too (a busy CI
    # machine made a hung single-host job a "slow link" and delayed its hang past its bound)
    alone = judge_silence(Silence("h1", (), 0, "backward", 8.0, 3.0, 1800.0, 0.2), window(125_000), 8000.0)
    assert alone.kind is SilenceKind.HANG and "one host" in alone.reason
    nic = dataclasses.replace(window(125_000, over=900), source="this host's interfaces")
    only_nic = judge_silence(SILENT, nic, 8000.0)
    assert only_nic.kind is SilenceKind.HANG and "could not be read" in only_nic.reason


def test_a_link_still_moving_data_is_a_slow_link_on_the_host_whose_link_is_over_its_limit():
    v = judge_silence(SILENT, window(125_000, over=900), 64 * KBIT)
    assert v.kind is SilenceKind.SLOW_LINK and v.host == "h1" and v.local and v.slow_link
    assert v.slowdown == 40.0 and v.confidence >= 0.8
    assert "1,000 kbit/s" in v.reason and "900 over-limit" in v.reason


def test_without_local_throttling_or_drops_the_one_peer_is_named_when_sends_wait_and_with_several_none_is():
    # a host without a shaper on its link, whose sends wait: the slow end is its one peer
    waiting = dataclasses.replace(window(125_000), send_queued=371_523, shaped="")
    v = judge_silence(SILENT, waiting, 64 * KBIT)
    assert v.slow_link and v.host == "h0" and not v.local and "its one peer h0" in v.reason
    assert "sends wait" in v.reason
    # the same waits on a host whose own link is shaped (no over-limit in the window: its shaper paces
    # the acknowledgements its sends wait on): it may be the slow end itself, so it blames no one
    paced = judge_silence(SILENT, dataclasses.replace(waiting, shaped="tbf on eth0"), 64 * KBIT)
    assert paced.slow_link and paced.host == "" and "not known here" in paced.reason
    # nothing waits to be sent: the data is slow coming in, which a shaped receiving side of this very
    # host (outside its view) does too: no host is named, the peer is not blamed
    inbound = judge_silence(SILENT, window(125_000), 64 * KBIT)
    assert inbound.slow_link and inbound.host == "" and inbound.confidence == 0.5
    assert "slow coming in" in inbound.reason and "not known here" in inbound.reason
    many = judge_silence(Silence("h1", ("h0", "h2"), 0, None, 8.0, 3.0, 1800.0, 0.2), window(125_000), 8000.0)
    assert many.slow_link and many.host == ""


def test_a_link_gone_quiet_is_a_hang():
    quiet = judge_silence(SILENT, window(500), 64 * KBIT)  # keep-alives only
    assert quiet.kind is SilenceKind.HANG and "nothing moves" in quiet.reason
    # data moved early in the silence, then stopped: the collective is stuck now
    stopped = judge_silence(SILENT, window(125_000, recent=100.0), 64 * KBIT)
    assert stopped.kind is SilenceKind.HANG


def test_a_silence_past_the_collectives_timeout_or_outside_a_collective_or_unmeasured_is_a_hang():
    busy = window(125_000, over=900)
    past = Silence("h1", ("h0",), 0, "backward", 1800.0, 3.0, 1800.0, 0.2)
    assert judge_silence(past, busy, 8000.0).kind is SilenceKind.HANG
    data = Silence("h1", ("h0",), 0, "data", 8.0, 3.0, 1800.0, 0.2)
    assert "'data'" in judge_silence(data, busy, 8000.0).reason
    assert judge_silence(SILENT, None, 8000.0).kind is SilenceKind.HANG
    assert judge_silence(SILENT, busy, 0.0).reason == "slow-link check off"


def test_the_incident_names_the_slow_host_and_a_witness_is_not_the_blast_radius():
    own = slow_link_incident(judge_silence(SILENT, window(125_000, over=9), 8000.0), "h1", 0, T0, T0 - 8)
    assert own.cause.startswith("slow link on host h1") and own.blast_radius.nodes == ("h1",)
    assert own.blast_radius.ranks == (0,) and own.rule == "monitor:slow-link"
    waiting = dataclasses.replace(window(125_000), send_queued=4096, shaped="")  # sends wait on the peer
    seen = slow_link_incident(judge_silence(SILENT, waiting, 8000.0), "h1", 0, T0, T0 - 8)
    assert seen.blast_radius.nodes == ("h0",) and "witness h1: rank 0" in seen.evidence
    unknown = slow_link_incident(judge_silence(SILENT, window(125_000), 8000.0), "h1", 0, T0, T0 - 8)
    assert unknown.cause.startswith("slow link between hosts (which end is not known here)")
    assert unknown.blast_radius.nodes == () and unknown.blast_radius.ranks == ()


# --- the hang monitor applies it ----------------------------------------------------------------------

POLICY = HangTimeoutPolicy(multiplier=3.0, floor_s=3.0, startup_s=600.0)
HANGS = HangMonitor(POLICY, 600.0, 1800.0, link_min_bps=64 * KBIT, link_ceiling_s=1800.0)


def snap(now: float, link: tuple[LinkSample, ...], **kw) -> Snapshot:
    base = dict(
        now=now,
        tick=0.05,
        node="h1",
        started=T0 - 60,
        ranks=(RankView(0, T0, step=40, done_steps=40, sdk=True, section="backward"),),
        codes={0: None},
        step_times=tuple([0.2] * 40),
        world=WorldPlan(("h0", "h1"), (), 1, "two hosts"),
        total_steps=1000,
        max_done_step=39,
        link=link,
    )
    base.update(kw)
    return Snapshot(**base)


def test_a_crawling_collective_raises_a_slow_link_incident_instead_of_a_hang():
    link = moving(T0 - 5, T0 + 8, 125_000, over_per_s=50)
    d = HANGS(snap(T0 + 8, link))
    assert d is not None and d.kind is DecisionKind.STRAGGLERS and not d.ends_attempt
    assert d.incident is not None and d.incident.cause.startswith("slow link on host h1")
    # the step's communication time counts: 8.05 s (the check runs a tick ahead) over 0.2 s
    assert d.detected == ((0, 40.25),)
    # once flagged, the rank's later silences pass while the link keeps moving
    assert HANGS(snap(T0 + 8, link, stragglers={0: 40.25}, slow_links=frozenset({0}))) is None
    # the same silence over a quiet link is a hang
    quiet = moving(T0 - 5, T0 + 8, 200)
    hang = HANGS(snap(T0 + 8, quiet))
    assert hang is not None and hang.kind is DecisionKind.HANG
    # without the check (no counters read) the old verdict stands
    assert HANGS(snap(T0 + 8, ())).kind is DecisionKind.HANG


def test_traffic_from_before_the_silence_never_makes_a_hang_a_slow_link():
    # a busy step's all-reduce ran until the rank stopped at T0; from then on the workers' connections
    # are quiet: the sample before the onset must not lend the silence its bytes
    busy = moving(T0 - 5, T0, 2_000_000, over_per_s=50)
    link = busy + tuple(sample(T0 + i, int(2_000_000 * 5), over=250) for i in (0.5, 1.5, 2.5))
    d = HANGS(snap(T0 + 3, link))
    assert d is not None and d.kind is DecisionKind.HANG
    # with one sample inside the silence there is no window: a hang as before
    assert HANGS(snap(T0 + 3, busy + (sample(T0 + 0.5, 10_000_000),))).kind is DecisionKind.HANG


def test_past_the_timeout_the_next_check_is_a_tick_away_not_a_busy_loop():
    s = snap(T0 + 8, moving(T0 - 5, T0 + 8, 125_000, over_per_s=50))
    assert HANGS.next_check(s) == s.now + s.tick
    early = snap(T0 + 1, ())
    assert HANGS.next_check(early) == T0 + 3.0 - early.tick


def test_on_the_slow_host_with_a_spare_and_the_gate_open_the_straggler_policy_excludes_it():
    gate = GateDecision("straggler", GateMode.ACT, "act: forced for the test")
    mon = StragglerMonitor(max_nodes=2, gate=gate, action=HANGS_ACTION)
    hangs = HangMonitor(POLICY, 600.0, 1800.0, 64 * KBIT, 1800.0, mon)
    world = WorldPlan(("h0", "h1"), ("h2",), 1, "two hosts and a spare")
    d = hangs(snap(T0 + 8, moving(T0 - 5, T0 + 8, 125_000, over_per_s=50), world=world, total_steps=100_000))
    assert d is not None and d.kind is DecisionKind.EXCLUDE_STRAGGLER and d.ends_attempt
    assert d.incident.action_taken and "slow link on host h1" in d.incident.cause
    assert d.advice and d.advice[0].action == "exclude_quarantine"
    # observe-only: the same verdict is recorded, not carried out
    watch = HangMonitor(
        POLICY, 600.0, 1800.0, 64 * KBIT, 1800.0, StragglerMonitor(max_nodes=2, action=HANGS_ACTION)
    )
    d = watch(snap(T0 + 8, moving(T0 - 5, T0 + 8, 125_000, over_per_s=50), world=world, total_steps=100_000))
    assert d.kind is DecisionKind.STRAGGLERS and d.advice[0].action == "observe_exclude_quarantine"


def test_a_witness_host_records_the_peers_slow_link_and_never_excludes_itself():
    gate = GateDecision("straggler", GateMode.ACT, "act")
    hangs = HangMonitor(
        POLICY,
        600.0,
        1800.0,
        64 * KBIT,
        1800.0,
        StragglerMonitor(max_nodes=2, gate=gate, action=HANGS_ACTION),
    )
    link = moving(T0 - 5, T0 + 8, 125_000, qdisc="noqueue", queued=371_523)  # its sends wait on h1
    d = hangs(snap(T0 + 8, link, node="h0", total_steps=100_000))
    assert d.kind is DecisionKind.STRAGGLERS and d.incident.blast_radius.nodes == ("h1",) and not d.advice
    assert d.detected == () and d.rank == 0  # its own rank is no straggler; it is raised once


def steps(durations):
    """Rank 0's steps, one a second from T0, each of the given duration."""
    return tuple(
        StepCompleted(ts=T0 + i, rank=0, step=i, start=T0 + i - d, duration=d)
        for i, d in enumerate(durations)
    )


def test_a_slow_links_straggler_clears_when_its_own_steps_are_back_at_the_healthy_pace():
    mon = StragglerMonitor()
    flagged = dict(stragglers={0: 12.0}, slow_links=frozenset({0}), straggler_step=30)
    still = snap(T0, (), recent_steps=steps([0.2] * 20 + [10.0] + [0.2] * 9), **flagged)
    assert mon(still) is None
    back = mon(snap(T0, (), recent_steps=steps([10.0] * 2 + [0.2] * 10), **flagged))
    assert back is not None and back.cleared == ((0, 1.0),)
    # a rank flagged by the comparison is not cleared for want of one (one rank per host)
    assert mon(snap(T0, (), recent_steps=steps([0.2] * 10), stragglers={0: 1.5}, straggler_step=30)) is None


def test_a_slow_link_raised_without_a_flag_is_watched_again_once_its_steps_are_back():
    # a witness (or a host that could not tell which end is slow) raised the silence but flagged no
    # straggler: once its steps run at the healthy pace its next slow silence is raised again
    mon = StragglerMonitor()
    raised = dict(slow_links=frozenset({0}), straggler_step=30)
    assert mon(snap(T0, (), recent_steps=steps([0.2] * 20 + [10.0] + [0.2] * 9), **raised)) is None
    back = mon(snap(T0, (), recent_steps=steps([10.0] * 2 + [0.2] * 10), **raised))
    assert back is not None and back.healed == (0,) and back.cleared == () and back.detected == ()
    ledger = RecordingLedger(node="h0")
    slow_links = {0}
    record_stragglers(ledger, T0 + 30, {}, back, 60, slow_links)
    assert slow_links == set() and not ledger.of(StragglerCleared) and not ledger.of(StragglerDetected)


def test_the_records_of_a_slow_link_name_the_host_once_and_flag_the_rank_until_it_clears():
    ledger = RecordingLedger(node="h1")
    current: dict[int, float] = {}
    slow_links: set[int] = set()
    d = HANGS(snap(T0 + 8, moving(T0 - 5, T0 + 8, 125_000, over_per_s=50)))
    record_stragglers(ledger, T0 + 8, current, d, 41, slow_links)
    raised = ledger.of(IncidentRaised)
    assert len(raised) == 1 and raised[0].nodes == ("h1",) and raised[0] in ledger.shown
    assert raised[0].cause.startswith("slow link on host h1")
    assert current == {0: 40.25} and slow_links == {0}
    assert [(e.rank, e.step) for e in ledger.of(StragglerDetected)] == [(0, 41)]
    cleared = Decision(DecisionKind.STRAGGLERS, "back", cleared=((0, 1.0),))
    record_stragglers(ledger, T0 + 30, current, cleared, 60, slow_links)
    assert current == {} and slow_links == set() and len(ledger.of(IncidentRaised)) == 1


def test_with_the_agents_clock_the_reads_run_off_the_callers_thread_and_stop_when_not_asked():
    taken = threading.Event()
    readers: set[int] = set()

    def sysfs():
        readers.add(threading.get_ident())
        taken.set()
        return {"eth0": IfCounters(5, 6, 0)}

    sampler = LinkSampler(
        sysfs=sysfs, qdiscs=dict, sockets=lambda pids: None, clock=lambda: T0, every_s=0.01, idle_s=0.2
    )
    sampler.sample(T0)
    assert taken.wait(timeout=30), "the sampling thread took no sample"
    assert sampler._thread is not None
    sampler._thread.join(timeout=30)  # nobody asks any more: it ends by itself
    assert not sampler._thread.is_alive()
    assert threading.get_ident() not in readers
    got = sampler.sample(T0)
    assert got and got[-1].ifaces["eth0"] == IfCounters(5, 6, 0) and got[-1].peers is None
