"""Faults across hosts (network namespaces, tests/hosts.py): time from the fault to the verdict or to
the next productive step, with the rendezvous on one host's c10d store or on a 3-member etcd cluster.

Scenarios (each agent runs stalwart.examples.charlm, 1 worker per host, default timeouts unless named):

* ``c10d-vanish``: 2 hosts, the one hosting the c10d store drops off the network and dies (nft drop,
  then SIGKILL): the survivor's verdict (exit 75) after the store timeout (default 60 s);
* ``etcd-vanish``: 3 hosts each with an etcd member; the round's leader (group rank 0: the workers'
  store) drops off and dies, with its etcd member: the survivors' first step at world size 2
  (``--startup-timeout 20``: the fault may hit a checkpoint save, whose silence is allowed that long).

* ``silent-host`` (and ``silent-host-4``): 3 (4) hosts, any size valid, no spare; the last drops off
  the network and dies behind the drop (no reset reaches the others): fault -> the first node's shrink
  decision (the heartbeat bound), -> the group re-formed in place, -> every survivor's next step
  (``--hang-floor 60``: the ranks' hang timeout must not be what decides);

* ``slow-link``: 2 hosts, h1's link limited by ``tc tbf`` both ways (1 and 2 Mbit/s) for 40 s, then
  20 s at full speed, with the slow-link check and without it (``--slow-link-kbit 0``, the hang
  detector alone): time to the verdict, hang restarts, steps h0 completed, the newest step's progress
  and the steps lost to rollbacks in that minute (``--hang-floor 3``, a checkpoint every 5 steps).

Needs root. Run: .venv/bin/python bench/bench_hosts.py [--scenario c10d-vanish|etcd-vanish|silent-host|slow-link] [--json out]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from tests.e2e.runner import events_so_far  # noqa: E402
from tests.e2e.test_hosts import _agent, _etcd_cluster  # noqa: E402

import hosts  # noqa: E402
from stalwart.events import AttemptStarted, JobEnded  # noqa: E402


def _steps(run_dir: Path, node: str | None = None) -> list:
    return [
        e
        for e in events_so_far(run_dir)
        if type(e).__name__ == "StepCompleted" and (node is None or e.node == node)
    ]


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise SystemExit(f"{what} did not happen within {timeout:.0f}s")


def c10d_vanish(root: Path) -> dict:
    run = root / "run"
    with hosts.Hosts(["h0", "h1"]) as h:
        procs = [_agent(h, n, run, "bench-c10d", last_call=60, read_timeout=None) for n in h.names]
        _wait(
            lambda: len({e.node for e in _steps(run)}) == 2 and len(_steps(run, "h0")) >= 20, 300, "training"
        )
        cut = time.time()
        h.vanish("h0")
        procs[1].communicate(timeout=600)
        end = [e for e in events_so_far(run, JobEnded) if e.node == "h1"][-1]
    return {"fault_to_verdict_s": round(end.ts - cut, 2), "exit_code": end.exit_code, "verdict": end.verdict}


def etcd_vanish(root: Path) -> dict:
    run = root / "run"
    with hosts.Hosts(["h0", "h1", "h2"]) as h:
        endpoints = _etcd_cluster(h, root)
        flags = (
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            endpoints,
            "--nnodes",
            "2:3",
            "--startup-timeout",
            "20",
        )
        procs = [_agent(h, n, run, "bench-etcd", *flags, batch=24, last_call=3) for n in h.names]
        three = _wait(
            lambda: [e for e in events_so_far(run, AttemptStarted) if e.num_nodes == 3],
            300,
            "a round of three",
        )
        leader = next(e.node for e in three if e.group_rank == 0)
        _wait(lambda: len(_steps(run, leader)) >= 20, 300, "training")
        cut = time.time()
        h.vanish(leader)
        after = _wait(
            lambda: [
                e for e in _steps(run) if e.ts > cut and e.node != leader and e.attempt > three[0].attempt
            ],
            600,
            "a step after the fault",
        )
        detected = [e for e in events_so_far(run) if type(e).__name__ == "FailureDetected" and e.ts > cut]
        for p in procs:
            p.kill()
    return {
        "fault_to_detection_s": round(min(e.ts for e in detected) - cut, 2) if detected else None,
        "fault_to_next_step_s": round(min(e.ts for e in after) - cut, 2),
    }


def _slow_link_run(root: Path, rate: str, throttle_s: float, after_s: float, check: bool) -> dict:
    """2 hosts; h1's link limited to ``rate`` for ``throttle_s``, then ``after_s`` at full speed; with
    the slow-link check on (``check``) or off (``--slow-link-kbit 0``: the hang detector alone)."""
    run = root / ("run-check" if check else "run-nocheck")
    extra = () if check else ("--slow-link-kbit", "0")
    with hosts.Hosts(["h0", "h1"]) as h:
        procs = [_agent(h, n, run, f"bench-slow-{int(check)}", *extra, read_timeout=None) for n in h.names]
        _wait(
            lambda: len({e.node for e in _steps(run)}) == 2 and len(_steps(run, "h0")) >= 20, 300, "training"
        )
        cut = time.time()
        top_at_cut = max(e.step for e in _steps(run, "h0"))
        h.slow("h1", rate)
        time.sleep(throttle_s)
        h.unslow("h1")
        time.sleep(after_s)
        end = time.time()
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    evs = [e for e in events_so_far(run) if cut < e.ts <= end]
    hangs = [e for e in evs if type(e).__name__ == "FailureDetected"]
    slow = [e for e in evs if type(e).__name__ == "IncidentRaised" and "slow link" in e.cause]
    steps = [e for e in evs if type(e).__name__ == "StepCompleted" and e.node == "h0"]
    crawled = [e for e in steps if e.ts <= cut + throttle_s]
    top = max((e.step for e in steps), default=top_at_cut)
    verdicts = [e.ts for e in slow] or [e.ts for e in hangs]
    return {
        "fault_to_verdict_s": round(min(verdicts) - cut, 2) if verdicts else None,
        "verdict": ("slow link on " + ",".join(sorted(set(slow[0].nodes))))
        if slow
        else (hangs[0].failure if hangs else "none"),
        "restarts": len({(e.node, e.attempt) for e in hangs}),
        "steps_while_slow": len(crawled),  # steps h0 completed while the link was slow
        "steps_done": len(steps),  # steps h0 completed in the window, redone ones included
        "net_progress": top - top_at_cut,  # how far the newest step moved in the window
        "steps_lost": len(steps) - (top - top_at_cut),  # completed, then redone after a rollback
        "window_s": round(end - cut, 1),
    }


def slow_link(root: Path, rates: tuple[str, ...] = ("1mbit", "2mbit"), throttle_s: float = 40.0) -> dict:
    """One host's link slow for ``throttle_s`` (``tc tbf`` both ways), at each rate: the slow-link check
    against the hang detector alone (the old behaviour: a hang restart per crawling step)."""
    out = {}
    for rate in rates:
        for check in (True, False):
            key = f"{rate} {'slow-link check' if check else 'hang detector only'}"
            out[key] = _slow_link_run(root / rate, rate, throttle_s, 20.0, check)
            print(key, out[key], flush=True)
    return out


def silent_host(root: Path, n: int = 3) -> dict:
    """``n`` hosts (any size valid, no spare); the last drops off the network and dies behind the drop,
    so no connection of the others is reset. Fault -> the first node's shrink decision (its heartbeat
    bound), -> the group re-formed in place, -> every survivor's first step at the smaller size; the
    survivors' workers must keep their processes (no attempt after the first on them)."""
    run, names = root / "run", [f"h{i}" for i in range(n)]
    gone = names[-1]
    with hosts.Hosts(names) as h:
        procs = [_agent(h, m, run, "bench-silent", nnodes=f"2:{n}", batch=48, hang_floor=60) for m in names]
        _wait(
            lambda: len({e.node for e in _steps(run)}) == n and len(_steps(run, "h0")) >= 20, 300, "training"
        )
        cut = time.time()
        h.vanish(gone)
        shrunk = _wait(
            lambda: [
                e for e in events_so_far(run) if type(e).__name__ == "ReformedInPlace" and e.shrunk_from
            ],
            120,
            "the shrink",
        )
        after = _wait(
            lambda: (lambda s: s if len({e.node for e in s}) == n - 1 else [])(
                [e for e in _steps(run) if e.ts > shrunk[0].ts and e.node != gone]
            ),
            120,
            "a step of every survivor",
        )
        decided = [
            e
            for e in events_so_far(run)
            if type(e).__name__ == "DecisionTaken" and e.ts > cut and e.action == "shrink_in_place"
        ]
        restarted = [e for e in events_so_far(run, AttemptStarted) if e.node != gone and e.attempt > 0]
        for p in procs:
            p.kill()
    first = {}
    for e in after:
        first.setdefault(e.node, e.ts)
    return {
        "hosts": n,
        "fault_to_decision_s": round(min(e.ts for e in decided) - cut, 2) if decided else None,
        "fault_to_reformed_s": round(shrunk[0].ts - cut, 2),
        "fault_to_next_step_s": round(max(first.values()) - cut, 2),
        "phases": shrunk[0].phases,
        "survivors_restarted": len(restarted),
    }


SCENARIOS = {
    "c10d-vanish": c10d_vanish,
    "etcd-vanish": etcd_vanish,
    "slow-link": slow_link,
    "silent-host": silent_host,
    "silent-host-4": lambda root: silent_host(root, 4),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    ap.add_argument("--json")
    args = ap.parse_args()
    why = hosts.why_not()
    if why:
        raise SystemExit(why)
    out = {}
    for name in args.scenario or sorted(SCENARIOS):
        with tempfile.TemporaryDirectory(prefix="mh-bench-") as tmp:
            out[name] = SCENARIOS[name](Path(tmp))
        print(name, out[name], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
