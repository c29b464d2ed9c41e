"""Agents on separate hosts (network namespaces, tests/hosts.py): a rendezvous host that vanishes
without a reset, a partitioned host, a killed host, hosts that start apart, an agent that arrives
after the end. Each fault is a real one: nftables drops, SIGKILL.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import hosts
from stalwart.events import AttemptStarted, FailureDetected, IncidentRaised, JobEnded, JobStarted
from stalwart.exit_codes import EXIT_INFRA

from .runner import EXAMPLE, console, events, events_so_far

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(bool(hosts.why_not()), reason=hosts.why_not() or "-")]

ENDPOINT = f"{hosts.SUBNET}.1:29400"  # h0 hosts the rendezvous store


def _agent(
    h: hosts.Hosts,
    name: str,
    run_dir: Path,
    run_id: str,
    *extra: str,
    batch: int = 32,
    last_call: int | None = 60,
    read_timeout: int | None = 15,
    steps: int = 100000,
    hang_floor: int = 3,
    nnodes: str = "1:2",
) -> subprocess.Popen:
    conf = f"is_host={int(name == 'h0')}"
    if last_call is not None:
        conf += f",last_call_timeout={last_call}"
    if read_timeout is not None:
        conf += f",read_timeout={read_timeout}"
    argv = [
        sys.executable,
        "-m",
        "stalwart.cli",
        "run",
        "-q",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        "1",
        "--rdzv-endpoint",
        ENDPOINT,
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        conf,
        "--run-dir",
        str(run_dir),
        "--node-name",
        name,
        "--hang-floor",
        str(hang_floor),
        *extra,
        *EXAMPLE,
        "--steps",
        str(steps),
        "--checkpoint-every",
        "5",
        "--global-batch",
        str(batch),
    ]
    return h.popen(name, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _training_on_two(run_dir: Path, procs: list[subprocess.Popen], timeout: float = 240.0) -> None:
    """Wait (bounded) until both hosts started an attempt of world size 2 and stepped in it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"an agent exited ({p.returncode}) before training: {p.stdout.read()}")
        started = [e for e in events_so_far(run_dir, AttemptStarted) if e.num_nodes == 2]
        if {e.node for e in started} == {"h0", "h1"}:
            steps = [e for e in events_so_far(run_dir) if type(e).__name__ == "StepCompleted"]
            if len({e.node for e in steps}) == 2 and len(steps) >= 20:
                return
        time.sleep(0.5)
    raise AssertionError(f"the two hosts did not train together within {timeout:.0f}s")


def test_the_rendezvous_host_vanishing_ends_a_single_endpoint_job_with_exit_75(tmp_path):
    with hosts.Hosts(["h0", "h1"]) as h:
        a = _agent(h, "h0", tmp_path, "mh-vanish")
        b = _agent(h, "h1", tmp_path, "mh-vanish")
        _training_on_two(tmp_path, [a, b])
        h.vanish("h0")  # off the network first, then dead: h1 never sees a reset
        # the kernel's own give-up on h1's connections takes about 15 minutes: far past this wait
        out_b, _ = b.communicate(timeout=180)
    assert b.returncode == EXIT_INFRA, out_b
    end = [e for e in events(tmp_path, JobEnded) if e.node == "h1"][-1]
    assert end.outcome == "rendezvous_failed" and end.requeue_helps
    assert f"the rendezvous store at {ENDPOINT} has not answered for" in end.verdict
    assert "store timeout 15s" in end.verdict


def test_a_partitioned_host_notices_within_its_hang_timeout(tmp_path):
    # the store timeout (60 s) is longer than the cut: what notices it is the hang monitor, whose
    # allowance is the hang timeout (3 s floor) or, if the cut lands in a checkpoint save, 20 s
    extra = ("--max-restarts", "5", "--startup-timeout", "20")
    with hosts.Hosts(["h0", "h1"]) as h:
        a = _agent(h, "h0", tmp_path, "mh-cut", *extra, read_timeout=None)
        b = _agent(h, "h1", tmp_path, "mh-cut", *extra, read_timeout=None)
        _training_on_two(tmp_path, [a, b])
        cut = time.time()
        h.partition("h1")
        noticed: list[FailureDetected] = []
        deadline = time.monotonic() + 45.0
        while not noticed and time.monotonic() < deadline:
            noticed = [e for e in events_so_far(tmp_path, FailureDetected) if e.node == "h1" and e.ts > cut]
            time.sleep(0.5)
        h.heal("h1")
        healed = time.time()
        for p in (a, b):
            p.kill()
            p.wait(timeout=30)
    # the isolated host's own monitors saw it while the cut lasted (no frozen tick behind the store)
    assert noticed, "the isolated host detected nothing while it was cut off"
    assert noticed[0].ts < healed and noticed[0].failure in ("hang", "peer_lost")


def test_the_merged_report_of_a_partition_books_the_survivors_steps_and_the_isolated_hosts_wait(tmp_path):
    # h1 notices the cut late (a 40 s hang floor, 45 s in a save) while h0 (3 s, 15 s in a save)
    # re-forms alone and trains: the merged account must not book h0's training as h1's detection;
    # each host's line says what it saw. h1's allowance stays under its store timeout (60 s): a cut
    # that lands in a save must still end in a hang h1 detects, not in the store's silence (which,
    # at an equal 60 s, won that race on a busy machine and ended h1 without a detection)
    quick = ("--max-restarts", "5", "--startup-timeout", "15")
    slow = ("--max-restarts", "5", "--startup-timeout", "45")
    with hosts.Hosts(["h0", "h1"]) as h:
        a = _agent(h, "h0", tmp_path, "mh-acct", *quick, read_timeout=None, last_call=None)
        b = _agent(h, "h1", tmp_path, "mh-acct", *slow, read_timeout=None, last_call=None, hang_floor=40)
        _training_on_two(tmp_path, [a, b])
        cut = time.time()
        h.partition("h1")
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            alone = [e for e in events_so_far(tmp_path) if type(e).__name__ == "StepCompleted" and e.ts > cut]
            late = [e for e in events_so_far(tmp_path, FailureDetected) if e.node == "h1" and e.ts > cut]
            if late and len({e.step for e in alone if e.node == "h0"}) >= 10:
                break
            time.sleep(0.5)
        h.heal("h1")
        for p in (a, b):
            p.kill()
            p.wait(timeout=30)
    from stalwart.account.report import build

    evs = events(tmp_path)
    rep = build(tmp_path)
    solo = [e for e in evs if isinstance(e, AttemptStarted) and e.node == "h0" and e.ts > cut]
    assert solo and solo[0].num_nodes == 1, solo
    mine = [
        e
        for e in evs
        if type(e).__name__ == "StepCompleted" and e.node == "h0" and e.attempt == solo[0].attempt
    ]
    line0 = next(x for x in rep["hosts"] if x["node"] == "h0")
    seen = next(a for a in line0["attempts"] if a["attempt"] == solo[0].attempt)
    assert (seen["num_nodes"], seen["steps"]) == (1, len({e.step for e in mine})) and seen["steps"] >= 10
    # h1's own detection, as its ledger says
    late = [e for e in evs if isinstance(e, FailureDetected) and e.node == "h1" and e.ts > cut]
    line1 = next(x for x in rep["hosts"] if x["node"] == "h1")
    assert late, [e for e in evs if e.node == "h1" and e.ts > cut and type(e).__name__ != "StepCompleted"]
    assert line1["detections"][0]["detected"] == late[0].ts
    # in the merged timeline h0's steps alone are never h1's detection, restart or lost work
    ranks0 = [e for e in mine if e.rank == 0]
    lo, hi = min(e.start for e in ranks0), max(e.start + e.duration for e in ranks0)
    from stalwart.account.goodput import compute

    gp = compute(evs)
    booked: dict[str, float] = {}
    for a0, b0, label in gp.timeline:
        booked[label] = booked.get(label, 0.0) + max(0.0, min(b0, hi) - max(a0, lo))
    assert late[0].ts > lo, "h1 noticed before h0 trained alone: nothing late to keep apart"
    training = {"productive", "checkpoint_stall", "straggler_slowdown"}
    assert {k for k, v in booked.items() if v > 0} <= training and booked.get("productive", 0.0) > 0, booked
    top = max(e.step for e in evs if type(e).__name__ == "StepCompleted" and e.rank == 0)
    assert rep["steps_completed"] == top + 1


def test_a_killed_host_is_named_in_the_survivors_incident(tmp_path):
    with hosts.Hosts(["h0", "h1"]) as h:
        a = _agent(h, "h0", tmp_path, "mh-kill")
        b = _agent(h, "h1", tmp_path, "mh-kill")
        _training_on_two(tmp_path, [a, b])
        h.kill("h1")
        deadline = time.monotonic() + 90.0
        named: list[IncidentRaised] = []
        while not named and time.monotonic() < deadline:
            named = [
                e for e in events_so_far(tmp_path, IncidentRaised) if e.node == "h0" and "left" in e.cause
            ]
            time.sleep(0.5)
        a.kill()
        a.wait(timeout=30)
    assert named, "the survivor raised no incident naming a host that left"
    inc = named[0]
    assert "h1" in inc.nodes and "h0" not in inc.nodes, inc
    assert "h1" in inc.cause and any("witness" in e and "h0" in e for e in inc.evidence), inc


def test_a_killed_host_is_replaced_in_place_by_a_hot_spare_host(tmp_path):
    """Three hosts at a power-of-two size: h0 and h1 train, h2 stands by. h1 is killed (every process
    in its namespace): h2 sees h1's heartbeat stop while h0's rank waits, takes h1's place in place,
    and h0's rank keeps its process; the job finishes on h0 and h2."""
    from stalwart.events import DecisionTaken, ReformedInPlace

    spare = ["--valid-sizes", "pow2"]
    with hosts.Hosts(["h0", "h1", "h2"]) as h:
        procs = {
            n: _agent(h, n, tmp_path, "mh-spare", *spare, nnodes="2:3", steps=240) for n in ("h0", "h1", "h2")
        }
        _training_on_two(tmp_path, [procs["h0"], procs["h1"]])
        h.kill("h1")
        outs = {n: procs[n].communicate(timeout=300)[0] for n in ("h0", "h2")}
    assert procs["h0"].returncode == 0 and procs["h2"].returncode == 0, outs
    took = [e for e in events(tmp_path, DecisionTaken) if e.action == "take_over"]
    assert [e.node for e in took] == ["h2"] and "node h1 is lost" in took[0].reason, took
    assert [e.node for e in events(tmp_path, DecisionTaken) if e.action == "joined_in_place"] == ["h0"]
    [done] = events(tmp_path, ReformedInPlace)
    assert done.node == "h2" and done.bytes_moved > 0
    assert not [e for e in events(tmp_path, AttemptStarted) if e.node == "h0" and e.attempt > 0], (
        "h0 restarted"
    )


def test_a_killed_host_comes_back_and_the_shrunk_group_takes_it_in_place(tmp_path):
    """Three hosts, any size valid, no spare. h1 is killed (every process in its namespace): h0 shrinks
    the group in place to h0 and h2. Then h1's agent starts again on the same host: it finds the
    running round's worker store on h0 through the rendezvous store, offers itself, starts its rank
    while the group trains on, and the group grows back to three in place; h0 and h2 never restart."""
    from stalwart.events import DecisionTaken, ReformedInPlace, StepCompleted

    def until(what: str, check, timeout: float = 240.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            if any(p.poll() is not None for n, p in procs.items() if n != "h1"):
                break  # a survivor ended: it will not happen
            time.sleep(0.5)
        raise AssertionError(f"{what} did not happen: {outs()}")

    with hosts.Hosts(["h0", "h1", "h2"]) as h:
        # a global batch that 2 and 3 ranks divide
        procs = {n: _agent(h, n, tmp_path, "mh-grow", nnodes="2:3", batch=48) for n in ("h0", "h1", "h2")}

        def outs() -> dict:
            return {n: p.returncode for n, p in procs.items()}

        until("training on three", lambda: len({e.node for e in events_so_far(tmp_path, StepCompleted)}) == 3)
        h.kill("h1")
        shrunk = until(
            "the shrink", lambda: [e for e in events_so_far(tmp_path, ReformedInPlace) if e.shrunk_from]
        )
        procs["h1"] = _agent(h, "h1", tmp_path, "mh-grow", nnodes="2:3", batch=48)
        grown = until(
            "the grow", lambda: [e for e in events_so_far(tmp_path, ReformedInPlace) if e.grown_from]
        )
        until(
            "h1 stepping in the grown group",
            lambda: [
                e for e in events_so_far(tmp_path, StepCompleted) if e.node == "h1" and e.ts > grown[0].ts
            ],
        )
        alive = {n: p.poll() for n, p in procs.items()}
    assert alive == {"h0": None, "h1": None, "h2": None}, alive  # all three still training
    assert shrunk[0].node == "h0" and (shrunk[0].shrunk_from, shrunk[0].world_size) == (3, 2), shrunk
    assert grown[0].node == "h0" and (grown[0].grown_from, grown[0].world_size, grown[0].ranks) == (
        2,
        3,
        (2,),
    )
    [grow] = [e for e in events(tmp_path, DecisionTaken) if e.action == "grow_in_place"]
    assert "node h1 offered" in grow.reason, grow
    [took] = [e for e in events(tmp_path, DecisionTaken) if e.action == "take_over"]
    assert took.node == "h1" and "took node h1 back" in took.reason, took
    assert not [e for e in events(tmp_path, AttemptStarted) if e.node != "h1" and e.attempt > 0], (
        "a survivor restarted"
    )
    [back] = [e for e in events(tmp_path, ReformedInPlace) if e.node == "h1"]
    assert back.bytes_moved > 0 and back.generation == grown[0].generation, back  # the live state, received


def test_a_host_gone_silent_is_shrunk_out_in_place_without_waiting_for_the_hang_timeout(tmp_path):
    """Three hosts, any size valid, no spare. h2 drops off the network and dies behind the drop: no
    connection of h0 or h1 is reset, and their ranks wait in a collective with h2. h0 finds h2 silent
    by its heartbeat bound (its liveness line quiet, and h0's kernel took no segment from h2's address
    on any connection: not a slow link, tests/e2e/test_hosts_link.py) and shrinks the group in place; the survivors' ranks, stuck in that step,
    sever it once the re-form is asked (train/inplace.py StuckStep) instead of waiting for their hang
    timeout (60 s here: it must not be what decides), and the job goes on at two in the same processes."""
    from stalwart.events import ReformedInPlace, StepCompleted

    with hosts.Hosts(["h0", "h1", "h2"]) as h:
        procs = {
            n: _agent(h, n, tmp_path, "mh-silent", nnodes="2:3", batch=48, hang_floor=60)
            for n in ("h0", "h1", "h2")
        }
        deadline = time.monotonic() + 240.0
        while len({e.node for e in events_so_far(tmp_path, StepCompleted)}) < 3:
            assert time.monotonic() < deadline, "the three hosts did not train together"
            assert all(p.poll() is None for p in procs.values()), "an agent ended before training"
            time.sleep(0.5)
        cut = time.time()
        h.vanish("h2")
        shrunk: list = []
        deadline = time.monotonic() + 90.0
        while not shrunk and time.monotonic() < deadline:
            shrunk = [e for e in events_so_far(tmp_path, ReformedInPlace) if e.shrunk_from]
            time.sleep(0.5)
        after: list = []
        while shrunk and len({e.node for e in after}) < 2 and time.monotonic() < deadline:
            after = [e for e in events_so_far(tmp_path, StepCompleted) if e.ts > shrunk[0].ts]
            time.sleep(0.5)
        alive = {n: procs[n].poll() for n in ("h0", "h1")}
    assert shrunk, "the group did not shrink in place"
    assert shrunk[0].node == "h0" and (shrunk[0].shrunk_from, shrunk[0].world_size) == (3, 2), shrunk
    assert {e.node for e in after} == {"h0", "h1"}, "the survivors did not train on"
    assert alive == {"h0": None, "h1": None}, alive
    assert not [e for e in events(tmp_path, AttemptStarted) if e.node != "h2" and e.attempt > 0], (
        "a survivor restarted its workers"
    )
    hangs = [
        e for e in events(tmp_path, FailureDetected) if e.node != "h2" and e.ts > cut and e.failure == "hang"
    ]
    assert not hangs, hangs  # the heartbeat bound decided, not a rank's hang timeout
    [inc] = [e for e in events(tmp_path, IncidentRaised) if e.node == "h0" and e.ts > cut and "h2" in e.nodes]
    assert "silent" in inc.cause or "heartbeat" in inc.cause, inc


# --- etcd: no single host whose loss ends the job -----------------------------------------------------


def _etcd_cluster(h: hosts.Hosts, root: Path, names: list[str] | None = None) -> str:
    """One etcd member per host (of ``names``, default all); the client endpoints, once the cluster
    answers (bounded wait)."""
    names = names or h.names
    peers = ",".join(f"{n}=http://{h.addr(n)}:2380" for n in names)
    for n in names:
        ip = h.addr(n)
        argv = ["etcd", "--name", n, "--data-dir", str(root / f"etcd-{n}"), "--initial-cluster", peers]
        argv += ["--listen-client-urls", f"http://{ip}:2379", "--advertise-client-urls", f"http://{ip}:2379"]
        argv += [
            "--listen-peer-urls",
            f"http://{ip}:2380",
            "--initial-advertise-peer-urls",
            f"http://{ip}:2380",
        ]
        argv += ["--initial-cluster-state", "new", "--initial-cluster-token", f"{h.tag}-etcd"]
        h.popen(n, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoints = ",".join(f"{h.addr(n)}:2379" for n in names)
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        check = h.popen(names[0], ["etcdctl", "--endpoints", endpoints, "endpoint", "health"])
        if check.wait(timeout=30) == 0:
            return endpoints
        time.sleep(0.5)
    raise AssertionError("the etcd cluster did not come up within 60 s")


def test_with_etcd_the_survivors_keep_training_after_the_round_leader_vanishes(tmp_path):
    names = ["h0", "h1", "h2"]
    with hosts.Hosts(names) as h:
        endpoints = _etcd_cluster(h, tmp_path)
        run_dir = tmp_path / "run"
        procs = {
            n: _agent(
                h,
                n,
                run_dir,
                "mh-etcd",
                "--rdzv-backend",
                "etcd",
                "--rdzv-endpoint",
                endpoints,
                "--nnodes",
                "2:3",
                "--startup-timeout",  # a save under way when the leader vanishes waits this long, not 300 s
                "20",
                batch=24,
                last_call=5,  # all three start together; a re-formed round of two waits only this long
            )
            for n in names
        }
        deadline = time.monotonic() + 240.0
        three: list[AttemptStarted] = []
        while len({e.node for e in three}) < 3 and time.monotonic() < deadline:
            three = [e for e in events_so_far(run_dir, AttemptStarted) if e.num_nodes == 3]
            time.sleep(0.5)
        assert len({e.node for e in three}) == 3, "the three hosts did not form a round"
        leader = next(e.node for e in three if e.group_rank == 0)  # it hosts the round's worker store
        while (
            time.monotonic() < deadline
            and len(
                [
                    e
                    for e in events_so_far(run_dir)
                    if type(e).__name__ == "StepCompleted" and e.node == leader
                ]
            )
            < 10
        ):
            time.sleep(0.5)
        cut = time.time()
        h.vanish(leader)  # its etcd member, its agent and its worker store: gone without a reset
        survivors = [n for n in names if n != leader]
        resumed: list = []
        deadline = time.monotonic() + 150.0
        while time.monotonic() < deadline and not resumed:
            after = [e for e in events_so_far(run_dir, AttemptStarted) if e.ts > cut and e.num_nodes == 2]
            later = [
                e
                for e in events_so_far(run_dir)
                if type(e).__name__ == "StepCompleted" and e.ts > cut and e.node in survivors
            ]
            if {e.node for e in after} == set(survivors) and {e.node for e in later} == set(survivors):
                resumed = after
            for n in survivors:
                assert procs[n].poll() is None, procs[n].stdout.read()
            time.sleep(0.5)
        for n in survivors:
            procs[n].kill()
            procs[n].wait(timeout=30)
    assert resumed, "the survivors did not train on together after the round leader vanished"
    assert {e.node for e in resumed} == set(survivors) and all(e.num_nodes == 2 for e in resumed)


# --- membership edges: hosts that start apart, an agent that arrives after the end ---------------------


def _when_started(run_dir: Path, node: str, timeout: float = 120.0) -> None:
    """Wait (bounded) until ``node``'s agent wrote its JobStarted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.node == node for e in events_so_far(run_dir, JobStarted)):
            return
        time.sleep(0.2)
    raise AssertionError(f"{node}'s agent did not start within {timeout:.0f}s")


def _formed_attempt_0_together(run_dir: Path, node: str, nodes: int) -> None:
    started = [e for e in events(run_dir, AttemptStarted) if e.node == node]
    assert [(e.attempt, e.num_nodes) for e in started] == [(0, nodes)], started


def test_a_host_starting_seconds_late_joins_attempt_0_and_a_later_agent_is_told_the_run_succeeded(tmp_path):
    # default windows: torch's 3 s last call for re-forms, Stalwart's 30 s start-up window for the first
    with hosts.Hosts(["h0", "h1"]) as h:
        a = _agent(h, "h0", tmp_path, "mh-skew", last_call=None, steps=40)
        _when_started(tmp_path, "h0")
        time.sleep(5.0)  # the skew under test: h1's agent starts 5 s after h0's is up
        b = _agent(h, "h1", tmp_path, "mh-skew", last_call=None, steps=40)
        out_a, _ = a.communicate(timeout=240)
        out_b, _ = b.communicate(timeout=60)
        assert (a.returncode, b.returncode) == (0, 0), out_a + out_b
        late = _agent(h, "h1", tmp_path, "mh-skew", last_call=None, steps=40)
        out_late, _ = late.communicate(timeout=60)
    for node in ("h0", "h1"):
        _formed_attempt_0_together(tmp_path, node, 2)
    final = max(e.step for e in events(tmp_path) if type(e).__name__ == "StepCompleted")
    assert late.returncode == 0, out_late
    said = console(out_late)
    assert f"already finished at step {final}" in said and "nothing launched" in said


def test_with_etcd_an_agent_arriving_after_the_success_says_so_without_a_shared_run_dir(tmp_path):
    with hosts.Hosts(["h0", "h1"]) as h:
        endpoints = _etcd_cluster(h, tmp_path)
        etcd = ("--rdzv-backend", "etcd", "--rdzv-endpoint", endpoints)
        dirs = {n: tmp_path / f"run-{n}" for n in ("h0", "h1", "late")}  # each host its own run dir
        a = _agent(h, "h0", dirs["h0"], "mh-etcd-end", *etcd, last_call=None, steps=30)
        _when_started(dirs["h0"], "h0")
        time.sleep(5.0)  # h1 starts late: the start-up window on etcd holds attempt 0 for it
        b = _agent(h, "h1", dirs["h1"], "mh-etcd-end", *etcd, last_call=None, steps=30)
        out_a, _ = a.communicate(timeout=240)
        out_b, _ = b.communicate(timeout=60)
        assert (a.returncode, b.returncode) == (0, 0), out_a + out_b
        late = _agent(h, "h1", dirs["late"], "mh-etcd-end", *etcd, last_call=None, steps=30)
        out_late, _ = late.communicate(timeout=60)
    _formed_attempt_0_together(dirs["h0"], "h0", 2)
    _formed_attempt_0_together(dirs["h1"], "h1", 2)
    final = max(e.step for e in events(dirs["h0"]) if type(e).__name__ == "StepCompleted")
    assert late.returncode == 0, out_late
    assert f"already succeeded at step {final}" in console(out_late), out_late
    end = events(dirs["late"], JobEnded)[-1]
    assert (end.outcome, end.exit_code) == ("succeeded", 0)
    assert not events(dirs["late"], AttemptStarted)  # it started no worker
