"""A lost node without a hot spare: the survivors shrink in place against a whole-group restart at the
smaller size, at 3, 4 and 6 nodes (one rank each by default).

Each node is one ``stalwart run`` agent over loopback (``--nnodes 2:N``, any size valid, the c10d
rendezvous on the first agent), running the same DDP job (stalwart.examples.charlm, a checkpoint every
EVERY steps). The agent of node n1 is SIGKILLed with its rank at step KILL_STEP, two ways:

* ``shrink``: n0 (the first surviving node, which watches the heartbeats) decides the node is lost
  after half of ``--in-place-announce-timeout`` of silence, announces the smaller world, and every
  surviving rank keeps its process, takes its new rank and the live state;
* ``whole``: ``--no-in-place``: the survivors' ranks fail on the lost peer, every agent stops its
  workers, the agents meet again in a new rendezvous round of N-1 nodes (which waits out the
  round's ``last_call_timeout`` for a node that might still join, ``--last-call``) and the group
  restarts warm from the fork servers and loads the newest checkpoint.

Measured from the merged ledger: fault -> every surviving rank completed a step that began after the
fault was detected, and the steps lost (shrink: the ledger's ``lost_steps``; whole: the steps
completed before the fault that the checkpoint did not hold).

``--against-src DIR`` compares the shrink with the shrink under another checkout's ``src`` instead.

Run: .venv/bin/python bench/bench_shrink.py [--nodes 3,4,6] [--repeats 1] [--last-call 4] [--global-batch 60]
[--against-src DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_inplace_nodes import agents, compare, steps_redone

from stalwart.events import ChaosInjected, FailureDetected, ReformedInPlace, StepCompleted
from stalwart.ledger import read_merged

STEPS, EVERY, KILL_STEP = 40, 10, 27
JOB = ["-m", "stalwart.examples.charlm", "--corpus-bytes", "300000", "--log-every", "0"]
JOB += ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--global-batch", "60"]  # 2 to 6 ranks


def run(work: Path, nodes: int, per_node: int, shrink: bool, last_call: float = 4.0, src: str = "") -> dict:
    run_dir = work / "run"
    chaos = f"kill-agent@node=1,step={KILL_STEP}"
    procs, outs = agents(
        run_dir, nodes, per_node, f"2:{nodes}", "bench-shrink", last_call, chaos, shrink, JOB, src
    )
    if any(p.returncode != 0 for i, p in enumerate(procs) if i != 1):
        raise RuntimeError("an agent failed: " + "\n".join(o[-1500:] for o in outs))
    evs = read_merged(run_dir)
    starts = [e for e in evs if type(e).__name__ == "AttemptStarted" and e.attempt == 0]
    if len(starts) != nodes:
        raise RuntimeError(f"the first round did not hold all {nodes} nodes")
    fault = min(e.ts for e in evs if isinstance(e, ChaosInjected) and e.fault.startswith("kill-agent"))
    detected = min(e.ts for e in evs if isinstance(e, FailureDetected) and e.ts >= fault)
    after = [e for e in evs if isinstance(e, StepCompleted) and e.start > detected and e.node != "n1"]
    ranks = {(e.node, e.rank) for e in after}
    firsts = [min(e.ts for e in after if (e.node, e.rank) == r) for r in ranks]
    row: dict = {"first_step_s": max(firsts) - fault, "detect_s": detected - fault, "ranks_after": len(ranks)}
    reformed = [e for e in evs if isinstance(e, ReformedInPlace)]
    if shrink:
        if not reformed or not reformed[0].shrunk_from:
            raise RuntimeError("the shrink run did not shrink in place")
        row.update(steps_lost=reformed[0].lost_steps, phases=reformed[0].phases)
    else:
        row["steps_lost"] = steps_redone(evs, fault)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="3,4,6")
    ap.add_argument("--per-node", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--last-call", type=float, default=4.0, help="the rendezvous round's last_call_timeout")
    ap.add_argument("--global-batch", type=int, default=60, help="divisible by N and N-1 ranks (8 nodes: 56)")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--against-src", default="", help="compare the shrink with the shrink under this src directory"
    )
    args = ap.parse_args()
    JOB[JOB.index("--global-batch") + 1] = str(args.global_batch)
    arms = {
        "shrink in place": lambda work, n: run(work, n, args.per_node, True, args.last_call),
        "whole-group restart": lambda work, n: run(work, n, args.per_node, False, args.last_call),
    }
    if args.against_src:
        other = str(Path(args.against_src).resolve())
        arms = {
            "shrink in place": arms["shrink in place"],
            "shrink, other src": lambda work, n: run(work, n, args.per_node, True, args.last_call, other),
        }
    compare([int(x) for x in args.nodes.split(",")], args.repeats, arms, "bench-shrink", args.json)


if __name__ == "__main__":
    main()
